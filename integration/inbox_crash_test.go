package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/postgres"
)

const (
	inboxCrashEnv        = "MILLBOX_INBOX_CRASH_CHILD"
	inboxCrashSchemaEnv  = "MILLBOX_INBOX_CRASH_SCHEMA"
	inboxCrashQueueEnv   = "MILLBOX_INBOX_CRASH_QUEUE"
	inboxCrashEffectsEnv = "MILLBOX_INBOX_CRASH_EFFECTS"
	inboxCommittedLine   = "MILLBOX-INBOX-COMMITTED "
)

// A consumer process is killed after its handler's transaction committed
// and before the message was acked. RabbitMQ redelivers the message to the
// restarted consumer, whose inbox skips it.
func TestInboxCrashAfterCommit(t *testing.T) {
	t.Parallel()
	f := newInboxFixture(t)
	queue := testenv.AMQPQueue(t)
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
	conformance.PublishCopies(t, testenv.AMQPPublisher(t), queue, msg, 1)

	cmd := exec.Command(os.Args[0], "-test.run=^TestInboxCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), inboxCrashEnv+"=1", inboxCrashSchemaEnv+"="+f.schema(),
		inboxCrashEffectsEnv+"="+f.EffectsTable, inboxCrashQueueEnv+"="+queue)
	cmd.Stderr = testenv.LogWriter(t, "consumer process: ")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	committed := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), inboxCommittedLine); ok {
				committed <- id
			}
		}
		close(committed)
	}()
	select {
	case id, ok := <-committed:
		if !ok || id != msg.UUID {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child committed %q (stdout open: %v), want %s", id, ok, msg.UUID)
		}
	case <-time.After(conformance.WaitTimeout):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("child never committed")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if n := f.Effect(msg.UUID); n != 1 {
		t.Fatalf("effect %d after the crash, want the child's committed 1", n)
	}

	// Restart: RabbitMQ redelivers the unacked message.
	sub, err := amqp3.NewSubscriber(testenv.AMQPConfig(testenv.AMQPURL()), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	r := conformance.StartRouter(t, func(r *message.Router) {
		r.AddMiddleware(f.Middleware("billing"))
		r.AddConsumerHandler("apply", queue, sub, f.EffectHandler)
	})
	f.WaitDeliveries(1)
	if h, d := f.Handled(), f.Duplicates(); h != 0 || d != 1 {
		t.Fatalf("after restart: handled %d, duplicates %d; want the redelivery skipped", h, d)
	}
	if n := f.Effect(msg.UUID); n != 1 {
		t.Fatalf("effect %d, want 1", n)
	}
	// The duplicate was acked: after the consumer stops, nothing is left.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := amqpQueueDepth(t, queue); n != 0 {
		t.Fatalf("%d messages left in the queue", n)
	}
}

func amqpQueueDepth(t *testing.T, queue string) int {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// TestInboxCrashChild is the consumer process of TestInboxCrashAfterCommit.
// It prints a line once its handler's transaction committed and then hangs
// without acking until it is killed.
func TestInboxCrashChild(t *testing.T) {
	if os.Getenv(inboxCrashEnv) == "" {
		t.Skip("helper process of TestInboxCrashAfterCommit")
	}
	env := pgDialectEnv(testenv.Postgres(t))
	d := postgres.MustNew(postgres.Options{Schema: os.Getenv(inboxCrashSchemaEnv)})
	f := conformance.AttachInboxFixture(t, env, env.DB, d, os.Getenv(inboxCrashEffectsEnv))
	sub, err := amqp3.NewSubscriber(testenv.AMQPConfig(testenv.AMQPURL()), watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	hangAfterCommit := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				return out, err
			}
			fmt.Println(inboxCommittedLine + msg.UUID)
			// Wait to be killed; exit on our own if the parent forgot.
			time.Sleep(time.Minute)
			os.Exit(3)
			return out, nil
		}
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	r.AddMiddleware(hangAfterCommit, f.Middleware("billing"))
	r.AddConsumerHandler("apply", os.Getenv(inboxCrashQueueEnv), sub, f.EffectHandler)
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}
