package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// BrokerRestartsEnv names the environment variable that allows tests to
// stop and start the shared RabbitMQ. Stopping it disturbs every other test
// that uses it at the time, so such tests run only when it is "1", alone.
const BrokerRestartsEnv = "MILLBOX_BROKER_RESTARTS"

// RequireBrokerRestarts skips the test unless BrokerRestartsEnv is "1".
func RequireBrokerRestarts(t testing.TB) {
	t.Helper()
	if os.Getenv(BrokerRestartsEnv) != "1" {
		t.Skipf("stops the shared RabbitMQ; run alone with %s=1", BrokerRestartsEnv)
	}
}

// StopRabbitMQ stops the RabbitMQ application on the local node
// (rabbitmqctl stop_app): every connection is closed and new ones are
// refused, while the node keeps its durable queues and persistent
// messages. The application is started again when the test ends, if the
// test has not done so itself.
func StopRabbitMQ(t testing.TB) {
	t.Helper()
	t.Cleanup(func() {
		if err := StartRabbitMQ(); err != nil {
			t.Errorf("start RabbitMQ again: %v", err)
		}
	})
	if out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput(); err != nil {
		t.Fatalf("rabbitmqctl stop_app: %v: %s", err, out)
	}
}

// StartRabbitMQ starts the RabbitMQ application (rabbitmqctl start_app) and
// waits until it accepts connections. Starting a running application does
// nothing.
func StartRabbitMQ() error {
	if out, err := exec.Command("rabbitmqctl", "start_app").CombinedOutput(); err != nil {
		return fmt.Errorf("rabbitmqctl start_app: %w: %s", err, out)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := dialAMQP(AMQPURL())
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("RabbitMQ does not accept connections after start_app: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReconnectingAMQPCollector is an AMQPCollector that survives broker
// restarts: when its connection closes it dials again and consumes on. It
// acknowledges each delivery once recorded (automatic acknowledgement
// would lose the deliveries in flight when the connection drops), so a
// delivery recorded but not yet acknowledged at a restart comes again
// as a duplicate.
type ReconnectingAMQPCollector struct {
	*Collection
	url    string
	queues []string

	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	conn   *amqp.Connection
}

// CollectAMQPAcrossRestarts starts a ReconnectingAMQPCollector on queues
// (declared durable) of the test RabbitMQ, closed after the test.
func CollectAMQPAcrossRestarts(t testing.TB, queues ...string) *ReconnectingAMQPCollector {
	t.Helper()
	url := RequireAMQP(t)
	if err := DeclareAMQPQueues(url, queues...); err != nil {
		t.Fatalf("declare queues: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &ReconnectingAMQPCollector{Collection: newCollection(), url: url, queues: queues, cancel: cancel, done: make(chan struct{})}
	go c.run(ctx)
	t.Cleanup(c.Close)
	return c
}

func (c *ReconnectingAMQPCollector) run(ctx context.Context) {
	defer close(c.done)
	for ctx.Err() == nil {
		if err := c.consumeOnce(ctx); err != nil {
			c.setErr(err)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// consumeOnce consumes on one connection until it closes.
func (c *ReconnectingAMQPCollector) consumeOnce(ctx context.Context) error {
	conn, err := dialAMQP(c.url)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.conn = conn
	c.mu.Unlock()
	defer conn.Close()
	if ctx.Err() != nil {
		return nil
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Qos(1000, 0, false); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, q := range c.queues {
		d, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			return fmt.Errorf("consume %s: %w", q, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for del := range d {
				c.add(amqpRecord(q, del))
				_ = del.Ack(false)
			}
		}()
	}
	wg.Wait()
	return fmt.Errorf("consumer connection closed")
}

// Close stops consuming and waits for the consumer to end.
func (c *ReconnectingAMQPCollector) Close() {
	c.cancel()
	c.mu.Lock()
	if c.conn != nil {
		_ = c.conn.Close()
	}
	c.mu.Unlock()
	<-c.done
}

// DeclareBoundedQueue declares a durable queue with a length limit, given
// as queue arguments (x-max-length: messages, x-max-length-bytes: bytes of
// message bodies), that rejects the publishes that would take it over the
// limit (x-overflow reject-publish-dlx: the broker nacks them and
// dead-letters them). It returns the name of the queue the rejected
// messages go to. Both are deleted after the test.
func DeclareBoundedQueue(t testing.TB, url, name string, limit amqp.Table) (rejected string) {
	t.Helper()
	rejected = name + "_rejected"
	args := amqp.Table{
		"x-overflow":                "reject-publish-dlx",
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": rejected,
	}
	for k, v := range limit {
		args[k] = v
	}
	err := withAMQPChannel(url, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(rejected, true, false, false, false, nil); err != nil {
			return err
		}
		_, err := ch.QueueDeclare(name, true, false, false, false, args)
		return err
	})
	if err != nil {
		t.Fatalf("declare %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := DeleteAMQPQueues(url, name, rejected); err != nil {
			t.Logf("delete queues %s: %v", name, err)
		}
	})
	return rejected
}

// AMQPQueueLength returns the number of ready messages in queue.
func AMQPQueueLength(url, queue string) (int, error) {
	var n int
	err := withAMQPChannel(url, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n, err
}
