package integration_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/middleware/kafkaid"
)

// inboxBroker is a real broker for the inbox scenarios: a publisher and a
// way to make subscribers that redeliver nacked messages.
type inboxBroker struct {
	pub    message.Publisher
	newSub func(t *testing.T) message.Subscriber
	topic  string
}

func inboxRabbit(t *testing.T) inboxBroker {
	t.Helper()
	queue := testenv.AMQPQueue(t)
	url := testenv.AMQPURL()
	return inboxBroker{
		pub:   testenv.AMQPPublisher(t),
		topic: queue,
		newSub: func(t *testing.T) message.Subscriber {
			sub, err := amqp3.NewSubscriber(testenv.AMQPConfig(url), watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Close() })
			return sub
		},
	}
}

func inboxKafka(t *testing.T) inboxBroker {
	t.Helper()
	topic := testenv.UniqueName("inbox_")
	k := testenv.StartKafka(t, topic)
	group := testenv.UniqueName("group_")
	return inboxBroker{
		pub:   k.Publisher(t),
		topic: topic,
		newSub: func(t *testing.T) message.Subscriber {
			return inboxKafkaSubscriber(t, k.Addrs(), group)
		},
	}
}

func inboxKafkaSubscriber(t *testing.T, addrs []string, group string) message.Subscriber {
	t.Helper()
	_ = testenv.KafkaSaramaConfig() // turns sarama's go-metrics off before any client starts
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         group,
		NackResendSleep:       time.Millisecond,
		OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Close() })
	return sub
}

var errLostAck = errors.New("ack lost after commit")

// loseAckOnce is outermost middleware that, after the inbox committed a
// "lost-ack" message, reports an error once, so the broker redelivers a
// message whose effect is already committed: what a crash between commit
// and ack does.
func loseAckOnce() message.HandlerMiddleware {
	var mu sync.Mutex
	lost := map[string]bool{}
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil || msg.Metadata.Get("mode") != "lost-ack" {
				return out, err
			}
			mu.Lock()
			defer mu.Unlock()
			if !lost[msg.UUID] {
				lost[msg.UUID] = true
				return nil, errLostAck
			}
			return out, nil
		}
	}
}

// runInboxBrokerScenario runs one consumer with the production middleware
// stack against a broker: a message published three times, one that fails
// and panics before it succeeds, one that always fails, and one whose ack
// is lost after commit.
func runInboxBrokerScenario(t *testing.T, b inboxBroker) {
	f := newInboxFixture(t)
	poison := conformance.NewGoChannel(t, true)
	nextPoisoned := subscribeOne(t, poison, "poison")
	sub := b.newSub(t)
	fl := newFailer()
	handler := func(msg *message.Message) error {
		n := fl.next(msg.UUID)
		if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
			return err
		}
		switch mode := msg.Metadata.Get("mode"); {
		case mode == "flaky" && n == 1:
			return conformance.ErrInjected
		case mode == "flaky" && n == 2:
			panic("injected panic")
		case mode == "poison":
			return conformance.ErrInjected
		}
		conformance.MarkHandled(msg)
		return nil
	}
	pq, err := wmw.PoisonQueue(poison, "poison")
	if err != nil {
		t.Fatal(err)
	}
	conformance.StartRouter(t, func(r *message.Router) {
		r.AddMiddleware(
			loseAckOnce(),
			pq,
			wmw.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware,
			wmw.Recoverer,
			f.Middleware("billing"),
		)
		r.AddConsumerHandler("apply", b.topic, sub, handler)
	})
	msg := func(mode string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(mode))
		m.Metadata.Set("mode", mode)
		return m
	}
	dup, flaky, bad, lostAck := msg("dup"), msg("flaky"), msg("poison"), msg("lost-ack")
	conformance.PublishCopies(t, b.pub, b.topic, dup, 3)
	for _, m := range []*message.Message{flaky, bad, lostAck} {
		conformance.PublishCopies(t, b.pub, b.topic, m, 1)
	}

	if p := nextPoisoned(); p.UUID != bad.UUID {
		t.Fatalf("poisoned %s, want %s", p.UUID, bad.UUID)
	}
	f.WaitDeliveries(6) // handled dup, flaky, lost-ack; duplicates: 2 of dup, 1 of lost-ack
	if h, d := f.Handled(), f.Duplicates(); h != 3 || d != 3 {
		t.Fatalf("handled %d, duplicates %d; want 3 and 3", h, d)
	}
	want := map[string]int{dup.UUID: 1, flaky.UUID: 1, lostAck.UUID: 1}
	if got := f.Effects(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("effects %v, want %v", got, want)
	}
	if a := [3]int{fl.count(flaky.UUID), fl.count(bad.UUID), fl.count(lostAck.UUID)}; a != [3]int{3, 3, 1} {
		t.Fatalf("attempts flaky/poison/lost-ack = %v, want [3 3 1]", a)
	}
}

func TestInboxRabbitMQ(t *testing.T) {
	t.Parallel()
	runInboxBrokerScenario(t, inboxRabbit(t))
}

func TestInboxKafka(t *testing.T) {
	t.Parallel()
	runInboxBrokerScenario(t, inboxKafka(t))
}

// With kafkaid the id is the record's place in the log: a redelivered
// record is a duplicate, a message produced twice is two records.
func TestInboxKafkaOffsetID(t *testing.T) {
	t.Parallel()
	b := inboxKafka(t)
	f := newInboxFixture(t)
	sub := b.newSub(t)
	conformance.StartRouter(t, func(r *message.Router) {
		r.AddMiddleware(loseAckOnce(), f.Middleware("billing", func(c *middleware.InboxConfig) {
			c.MessageID = kafkaid.MessageID
		}))
		r.AddConsumerHandler("apply", b.topic, sub, f.EffectHandler)
	})
	twice := message.NewMessage(watermill.NewUUID(), nil)
	lostAck := message.NewMessage(watermill.NewUUID(), nil)
	lostAck.Metadata.Set("mode", "lost-ack")
	conformance.PublishCopies(t, b.pub, b.topic, twice, 2)
	conformance.PublishCopies(t, b.pub, b.topic, lostAck, 1)
	f.WaitDeliveries(4)
	if h, d := f.Handled(), f.Duplicates(); h != 3 || d != 1 {
		t.Fatalf("handled %d, duplicates %d; want 3 and 1", h, d)
	}
	if e := f.Effects(); e[twice.UUID] != 2 || e[lostAck.UUID] != 1 {
		t.Fatalf("effects %v: want the re-produced message twice, the redelivered record once", e)
	}
	idRe := regexp.MustCompile(`^billing/apply\|` + regexp.QuoteMeta(b.topic) + `/\d+/\d+$`)
	for _, row := range f.InboxRows() {
		if !idRe.MatchString(row) {
			t.Fatalf("inbox row %q is not consumer|topic/partition/offset", row)
		}
	}
	// Outside a watermill-kafka subscription there is no offset.
	_, err := f.Middleware("billing", func(c *middleware.InboxConfig) { c.MessageID = kafkaid.MessageID })(
		func(*message.Message) ([]*message.Message, error) { return nil, nil },
	)(message.NewMessage(watermill.NewUUID(), nil))
	if !errors.Is(err, middleware.ErrNoMessageID) || !strings.Contains(err.Error(), "kafkaid") {
		t.Fatalf("want ErrNoMessageID from kafkaid, got %v", err)
	}
}
