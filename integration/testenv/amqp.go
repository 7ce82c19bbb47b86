package testenv

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp2 "github.com/ThreeDotsLabs/watermill-amqp/v2/pkg/amqp"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DefaultAMQPChannelPool is the publisher channel pool size the helpers
// configure. watermill-amqp's default of 0 opens and closes a channel (and,
// with confirms, switches it to confirm mode) for every Publish call.
const DefaultAMQPChannelPool = 64

// AMQPConfig returns watermill-amqp v3's durable queue config for url: the
// default exchange, the topic as the queue name and routing key, persistent
// messages, publisher confirms on and a pool of DefaultAMQPChannelPool
// channels. Publish does not declare the queue: declare it first (AMQPQueue,
// a collector, or a subscriber), or RabbitMQ drops the messages.
func AMQPConfig(url string) amqp3.Config {
	c := amqp3.NewDurableQueueConfig(url)
	c.Publish.ConfirmDelivery = true
	c.Publish.ChannelPoolSize = DefaultAMQPChannelPool
	return c
}

// AMQPConfigV2 is AMQPConfig for watermill-amqp v2.
//
// v2's topology builder binds a queue with QueueBind.GenerateRoutingKey
// called on the queue name rather than the topic, so configs that bind a
// queue to a named exchange by routing key (direct/topic exchanges with a
// queue name unlike the topic) route nothing. The durable queue config uses
// the default exchange, which needs no binding, and works as is.
func AMQPConfigV2(url string) amqp2.Config {
	c := amqp2.NewDurableQueueConfig(url)
	c.Publish.ConfirmDelivery = true
	c.Publish.ChannelPoolSize = DefaultAMQPChannelPool
	return c
}

// RequireAMQP returns the RabbitMQ URL after checking that it answers; when
// it does not, the test fails in CI and is skipped elsewhere.
func RequireAMQP(t testing.TB) string {
	t.Helper()
	url := AMQPURL()
	conn, err := dialAMQP(url)
	if err != nil {
		Unavailable(t, "RabbitMQ", err)
	}
	_ = conn.Close()
	return url
}

func dialAMQP(url string) (*amqp.Connection, error) {
	return amqp.DialConfig(url, amqp.Config{
		Heartbeat: 10 * time.Second,
		Locale:    "en_US",
		Dial:      amqp.DefaultDial(3 * time.Second),
	})
}

// AMQPQueue declares a durable queue with a unique name, as watermill-amqp's
// durable queue config would, and deletes it after the test. Use the name
// as the Watermill topic.
func AMQPQueue(t testing.TB) string {
	t.Helper()
	url := RequireAMQP(t)
	name := UniqueName("millbox_test_")
	if err := DeclareAMQPQueues(url, name); err != nil {
		t.Fatalf("declare queue: %v", err)
	}
	t.Cleanup(func() {
		if err := DeleteAMQPQueues(url, name); err != nil {
			t.Logf("delete queue %s: %v", name, err)
		}
	})
	return name
}

// DeclareAMQPQueues declares durable queues named queues, with the
// arguments watermill-amqp's durable queue config uses.
func DeclareAMQPQueues(url string, queues ...string) error {
	return withAMQPChannel(url, func(ch *amqp.Channel) error {
		for _, q := range queues {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				return fmt.Errorf("declare %s: %w", q, err)
			}
		}
		return nil
	})
}

// DeleteAMQPQueues deletes queues and the messages in them; unknown queues
// are not an error.
func DeleteAMQPQueues(url string, queues ...string) error {
	return withAMQPChannel(url, func(ch *amqp.Channel) error {
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				return fmt.Errorf("delete %s: %w", q, err)
			}
		}
		return nil
	})
}

func withAMQPChannel(url string, fn func(*amqp.Channel) error) error {
	conn, err := dialAMQP(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return fn(ch)
}

// AMQPPublisher returns a watermill-amqp v3 publisher with AMQPConfig,
// closed after the test.
func AMQPPublisher(t testing.TB) *amqp3.Publisher {
	t.Helper()
	cfg := AMQPConfig(RequireAMQP(t))
	// The test owns the connection: watermill-amqp v3.1.0 panics in the
	// publisher's Close when a pooled channel failed to reopen during a
	// broker outage (a nil *amqp.Channel), before it closes a connection
	// it owns, whose reconnecting goroutine would then outlive the test.
	conn, err := amqp3.NewConnection(cfg.Connection, watermill.NopLogger{})
	if err != nil {
		t.Fatalf("amqp v3 connection: %v", err)
	}
	p, err := amqp3.NewPublisherWithConnection(cfg, watermill.NopLogger{}, conn)
	if err != nil {
		_ = conn.Close()
		t.Fatalf("amqp v3 publisher: %v", err)
	}
	t.Cleanup(func() {
		defer func() { _ = conn.Close() }()
		defer func() {
			if r := recover(); r != nil {
				t.Logf("closing the watermill-amqp v3 publisher panicked: %v", r)
			}
		}()
		_ = p.Close()
	})
	return p
}

// AMQPPublisherV2 returns a watermill-amqp v2 publisher with AMQPConfigV2,
// closed after the test.
func AMQPPublisherV2(t testing.TB) *amqp2.Publisher {
	t.Helper()
	// v2 dereferences a nil logger when it builds the channel pool.
	p, err := amqp2.NewPublisher(AMQPConfigV2(RequireAMQP(t)), watermill.NopLogger{})
	if err != nil {
		t.Fatalf("amqp v2 publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// AMQPCollector consumes queues with automatic acknowledgement (no per
// message round trip, so it keeps up with any publisher) and records every
// delivery in its Collection. Key is the KeyMetadataField header, Offset
// the delivery tag, Partition 0.
type AMQPCollector struct {
	*Collection
	conn *amqp.Connection
	done chan struct{}
}

// NewAMQPCollector declares queues (durable, as AMQPQueue) and consumes
// them. The caller calls Close; the queues stay.
func NewAMQPCollector(url string, queues ...string) (*AMQPCollector, error) {
	conn, err := dialAMQP(url)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	c := &AMQPCollector{Collection: newCollection(), conn: conn, done: make(chan struct{})}
	var feeds []<-chan amqp.Delivery
	for _, q := range queues {
		if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("declare %s: %w", q, err)
		}
		d, err := ch.Consume(q, "", true, false, false, false, nil)
		if err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("consume %s: %w", q, err)
		}
		feeds = append(feeds, d)
	}
	closed := make(chan struct{}, len(feeds))
	for i, d := range feeds {
		go func() {
			defer func() { closed <- struct{}{} }()
			c.consume(queues[i], d)
		}()
	}
	go func() {
		for range feeds {
			<-closed
		}
		close(c.done)
	}()
	return c, nil
}

// CollectAMQP starts an AMQPCollector on the test RabbitMQ, closed after
// the test.
func CollectAMQP(t testing.TB, queues ...string) *AMQPCollector {
	t.Helper()
	c, err := NewAMQPCollector(RequireAMQP(t), queues...)
	if err != nil {
		t.Fatalf("amqp collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func (c *AMQPCollector) consume(queue string, deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		c.add(amqpRecord(queue, d))
	}
	if err := c.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		c.setErr(err)
	}
}

// amqpRecord turns a delivery from queue into a Record.
func amqpRecord(queue string, d amqp.Delivery) Record {
	rec := Record{
		Topic:    queue,
		Offset:   int64(d.DeliveryTag),
		Metadata: make(map[string]string, len(d.Headers)),
		Arrived:  time.Now(),
	}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		switch k {
		case amqp3.DefaultMessageUUIDHeaderKey:
			rec.UUID = s
		default:
			rec.Metadata[k] = s
		}
	}
	rec.Key = rec.Metadata[KeyMetadataField]
	return rec
}

// Close stops consuming and waits for the consumer goroutines to end.
func (c *AMQPCollector) Close() {
	_ = c.conn.Close()
	<-c.done
}
