package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

// ackLostPublisher publishes every message and then, the first time it
// sees a message marked "dup", reports a failure anyway: the broker has the
// message, the forwarder retries it, and the consumer gets it twice.
type ackLostPublisher struct {
	message.Publisher
	mu       sync.Mutex
	failed   map[string]bool
	injected atomic.Int64
}

func (p *ackLostPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		if m.Metadata.Get("dup") == "1" && !p.failed[m.UUID] {
			p.failed[m.UUID] = true
			p.injected.Add(1)
			return errors.New("injected: broker ack lost")
		}
	}
	return nil
}

// runInboxEndToEnd writes orders through the outbox, forwards them with a
// forwarder that is stopped and replaced half way and whose publisher
// duplicates every tenth message, and consumes them with the inbox: every
// order's effect happens exactly once.
func runInboxEndToEnd(t *testing.T, b inboxBroker) {
	const orders = 200
	f := newInboxFixture(t)
	ctx := testenv.Ctx(t, 2*time.Minute)
	ordersTable := `"` + f.schema() + `"."orders"`
	if _, err := f.pool.Exec(ctx, `CREATE TABLE `+ordersTable+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	dest := &ackLostPublisher{Publisher: b.pub, failed: map[string]bool{}}

	sub := b.newSub(t)
	var failures atomic.Int64
	conformance.StartRouter(t, func(r *message.Router) {
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err != nil {
					failures.Add(1)
					t.Logf("delivery of %s (%s) failed: %v", msg.UUID, msg.Payload, err)
				}
				return out, err
			}
		}, f.Middleware("fulfilment"))
		r.AddConsumerHandler("apply", b.topic, sub, func(msg *message.Message) error {
			if err := f.ApplyEffect(msg.Context(), string(msg.Payload)); err != nil {
				return err
			}
			conformance.MarkHandled(msg)
			return nil
		})
	})

	write := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			tx, err := f.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			id := "order-" + strconv.Itoa(i)
			if _, err := tx.Exec(ctx, `INSERT INTO `+ordersTable+` (id) VALUES ($1)`, id); err != nil {
				t.Fatal(err)
			}
			pub, err := forwarder.NewPublisher(pgxv5.WrapTx(tx), forwarder.PublisherConfig{Dialect: f.Dialect})
			if err != nil {
				t.Fatal(err)
			}
			msg := message.NewMessage(watermill.NewUUID(), []byte(id))
			msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-"+strconv.Itoa(i%7))
			if i%10 == 0 {
				msg.Metadata.Set("dup", "1")
			}
			if err := pub.Publish(b.topic, msg); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	startForwarder := func() func() {
		t.Helper()
		fw, err := forwarder.New(forwarder.Config{
			DB:          f.DB,
			Dialect:     f.Dialect,
			Destination: dest,
			Retry:       forwarder.ExponentialRetry{Min: 10 * time.Millisecond, Max: 100 * time.Millisecond},
			Logger:      testenv.Logger(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- fw.Run(context.Background()) }()
		select {
		case <-fw.Running():
		case err := <-errc:
			t.Fatalf("forwarder stopped at start: %v", err)
		}
		var once sync.Once
		stop := func() {
			once.Do(func() {
				if err := fw.Close(); err != nil {
					t.Errorf("close forwarder: %v", err)
				}
				if err := <-errc; err != nil {
					t.Errorf("forwarder run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		return stop
	}

	stop := startForwarder()
	write(0, orders/2)
	stop() // possibly with rows in flight
	write(orders/2, orders)
	startForwarder()

	conformance.WaitFor(t, fmt.Sprintf("%d orders handled", orders), func() bool { return f.Handled() >= orders })
	// Every injected duplicate reaches the consumer and is skipped.
	conformance.WaitFor(t, "the injected duplicates", func() bool { return f.Duplicates() >= dest.injected.Load() })
	conformance.WaitFor(t, "an empty outbox", func() bool { return len(conformance.ReadPending(t, ctx, f.DB, f.Dialect)) == 0 })

	if dest.injected.Load() != orders/10 {
		t.Fatalf("injected %d duplicates, want %d", dest.injected.Load(), orders/10)
	}
	effects := f.Effects()
	for id, n := range effects {
		if n != 1 {
			t.Errorf("order %s took effect %d times", id, n)
		}
	}
	if len(effects) != orders || f.Handled() != orders {
		t.Fatalf("%d orders took effect, handler ran %d times; want %d", len(effects), f.Handled(), orders)
	}
	for id, n := range effects {
		if n != 1 {
			t.Fatalf("order %s took effect %d times", id, n)
		}
	}
	t.Logf("%d orders, %d duplicate deliveries skipped", orders, f.Duplicates())
}

func TestInboxEndToEndKafka(t *testing.T) {
	t.Parallel()
	runInboxEndToEnd(t, inboxKafka(t))
}

func TestInboxEndToEndRabbitMQ(t *testing.T) {
	t.Parallel()
	runInboxEndToEnd(t, inboxRabbit(t))
}
