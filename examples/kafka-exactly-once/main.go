// Kafka-exactly-once forwards a PostgreSQL outbox to Kafka exactly once:
// two forwarders in exactly-once mode (forwarder.Config.ExactlyOnce with
// kafkabatch.TxPublisher) share the outbox, one of them stops half way and
// hands its partitions to the other, and two read_committed consumers, one
// with watermill-kafka and one with franz-go's kgo, check that every event
// arrived exactly once, each account's events in commit order.
//
//	go run ./examples/kafka-exactly-once
//	go run ./examples/kafka-exactly-once -n 10000 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// Exactly once holds for consumers that read committed data only: a
// consumer at Kafka's default isolation (read_uncommitted) also sees the
// messages of transactions that were aborted, such as those a forwarder
// had open when it crashed. For other destinations, and for consumers that
// cannot read committed, the inbox (package inbox) makes processing
// effectively once instead.
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable. Kafka runs in process
// (franz-go's kfake) unless -kafka names brokers. The tables live in a
// schema of their own, dropped at the end. The last line is a summary such
// as:
//
//	published=1000 watermill_received=1000 kgo_received=1000 duplicates=0 in_order=true ok=true
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	brokers := flag.String("kafka", "", "comma-separated Kafka `brokers` (default: an in-process Kafka)")
	n := flag.Int("n", 1000, "number of events to publish, one transaction each")
	keys := flag.Int("keys", 20, "number of accounts (ordering keys)")
	flag.Parse()
	if err := run(*pgURL, *brokers, *n, max(*keys, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "kafka-exactly-once:", err)
		os.Exit(1)
	}
}

func run(pgURL, brokers string, n, keys int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_eos_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}

	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	// The outbox's name at the brokers: its forwarders' transactional ids
	// derive from it, and its progress records are keyed by it. One per
	// outbox; the control topic may be shared.
	outboxID := "example-deposits-" + suffix
	topic, control := "deposits."+suffix, "example-progress-"+suffix
	wmGroup, kgoGroup := "example-watermill-"+suffix, "example-kgo-"+suffix
	defer stopKafka([]string{topic, control}, []string{wmGroup, kgoGroup})

	// The consumers, both read_committed. watermill-kafka's subscriber is
	// configured through sarama.
	subConfig := kafka.DefaultSaramaSubscriberConfig()
	subConfig.Consumer.IsolationLevel = sarama.ReadCommitted
	subConfig.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         wmGroup,
		OverwriteSaramaConfig: subConfig,
		// Demo topic; create production topics with your own tooling.
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 6, ReplicationFactor: 1},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	if err := sub.SubscribeInitialize(topic); err != nil {
		return err
	}
	kgoClient, err := kgo.NewClient(
		kgo.SeedBrokers(addrs...),
		kgo.ConsumerGroup(kgoGroup),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return err
	}
	defer kgoClient.Close()

	// Two forwarders, each with a transactional publisher of its own:
	// every partition of the outbox they hold gets a transactional
	// producer whose transactional.id derives from outboxID and the
	// partition, so whichever takes a partition over fences the other.
	var stops []func()
	for range 2 {
		pub, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{
			Config:          kafkabatch.Config{Brokers: addrs},
			TransactionalID: outboxID,
			ControlTopic:    control,
		})
		if err != nil {
			return err
		}
		defer pub.Close()
		fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: pub, ExactlyOnce: true})
		if err != nil {
			return err
		}
		stop, err := exampleenv.StartForwarder(ctx, fw)
		if err != nil {
			return err
		}
		defer stop()
		stops = append(stops, stop)
	}

	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		if i == n/2 {
			stops[0]() // its partitions move to the other forwarder
		}
		account, seq := "account-"+strconv.Itoa(i%keys), i/keys
		if err := deposit(ctx, pool, outbox, topic, account, seq); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d deposits with their events in %v\n", n, time.Since(start).Round(time.Millisecond))

	// Read back with both consumers.
	wm, kg := newTally(), newTally()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for wm.count() < n {
			select {
			case m := <-msgs:
				seq, _ := strconv.Atoi(m.Metadata.Get("seq"))
				wm.add(m.UUID, m.Metadata.Get(forwarder.DefaultKeyMetadataField), seq)
				m.Ack()
			case <-ctx.Done():
				return
			}
		}
	})
	wg.Go(func() {
		for kg.count() < n && ctx.Err() == nil {
			kgoClient.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var uuid, seq string
				for _, h := range r.Headers {
					switch h.Key {
					case kafka.UUIDHeaderKey:
						uuid = string(h.Value)
					case "seq":
						seq = string(h.Value)
					}
				}
				s, _ := strconv.Atoi(seq)
				kg.add(uuid, string(r.Key), s)
			})
		}
	})
	wg.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("watermill-kafka received %d, kgo %d of %d events: %w", wm.count(), kg.count(), n, ctx.Err())
	}
	time.Sleep(time.Second) // a duplicate would follow closely
	dups := wm.duplicates() + kg.duplicates()
	inOrder := wm.inOrder && kg.inOrder
	ok := dups == 0 && inOrder
	fmt.Printf("published=%d watermill_received=%d kgo_received=%d duplicates=%d in_order=%t ok=%t\n", n, wm.count(), kg.count(), dups, inOrder, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// tally counts what a consumer received.
type tally struct {
	mu      sync.Mutex
	seen    map[string]int // UUID -> deliveries
	next    map[string]int // account -> next expected seq
	inOrder bool
}

func newTally() *tally { return &tally{seen: map[string]int{}, next: map[string]int{}, inOrder: true} }

func (t *tally) add(uuid, account string, seq int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seen[uuid]++
	if t.seen[uuid] > 1 {
		return
	}
	if seq != t.next[account] {
		t.inOrder = false
		fmt.Printf("%s: seq %d arrived, expected %d\n", account, seq, t.next[account])
	}
	t.next[account] = seq + 1
}

func (t *tally) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.seen)
}

func (t *tally) duplicates() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	d := 0
	for _, c := range t.seen {
		d += c - 1
	}
	return d
}

// deposit publishes a deposit's event in one transaction (the deposit
// itself would be written in the same transaction).
func deposit(ctx context.Context, pool *pgxpool.Pool, outbox *forwarder.Publisher, topic, account string, seq int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"account":%q,"cents":100}`, account))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, account) // ordering key, and Kafka key
	msg.Metadata.Set("seq", strconv.Itoa(seq))
	if err := outbox.PublishTx(ctx, pgxv5.WrapTx(tx), topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
