package integration_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The ordering key travels with the row. The producers of these tests keep
// the key in a metadata field of their own (PublisherConfig.KeyMetadataField
// "aggregate_id", no partition_key), and every destination keys by the key
// stored with the row (destination.Key): the Kafka record key, the NATS
// subject, the Redis stream or the RabbitMQ queue of the key's group, and
// each key's order there.

// aggregateField is the producers' ordering-key field.
const aggregateField = "aggregate_id"

// The messages each test writes: aggregates keys, perAggregate messages
// each.
const aggregates, perAggregate = 40, 50

// keyGroups is how many subjects, streams or queues the keys are spread
// over.
const keyGroups = 4

// storedKeyOutbox is a Postgres outbox of the test's own.
func storedKeyOutbox(t *testing.T) (sqladapters.DB, sqladapters.Dialect) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	return db, testenv.PostgresDialect(t, db, pool, postgres.Options{})
}

// writeAggregates commits the test's messages to topic: message i of
// aggregate k carries aggregate_id "key-k" and seq i.
func writeAggregates(t *testing.T, db sqladapters.DB, d sqladapters.Dialect, topic string) {
	t.Helper()
	conformance.WriteKeyedIn(t, context.Background(), pgxSource(db), d, aggregateField, topic, aggregates, perAggregate, 10, 4)
}

// waitAggregates waits until the collections received every message of
// the test between them.
func waitAggregates(t *testing.T, cols ...*testenv.Collection) {
	t.Helper()
	n := aggregates * perAggregate
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		total := 0
		for _, c := range cols {
			total += c.Distinct()
		}
		if total >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages arrived", total, n)
		}
	}
}

// checkAggregates checks what the collections received: every message
// once; each aggregate's messages at one place (place: a Kafka partition,
// a subject, a stream, a queue), the one want names for its key when want
// is set, in seq order; and the aggregates spread over more than one place.
func checkAggregates(t *testing.T, place func(testenv.Record) string, want func(key string) string, cols ...*testenv.Collection) {
	t.Helper()
	type last struct {
		place string
		seq   int
	}
	lasts := map[string]last{}
	places := map[string]bool{}
	total := 0
	for _, c := range cols {
		if d := c.Duplicates(); d != 0 {
			t.Fatalf("%d duplicates in a clean run", d)
		}
		for _, r := range c.FirstDeliveries() {
			total++
			key := r.Metadata[aggregateField]
			if key == "" {
				t.Fatalf("message %s arrived without %s", r.UUID, aggregateField)
			}
			seq, err := strconv.Atoi(r.Metadata["seq"])
			if err != nil {
				t.Fatalf("message %s: seq %q", r.UUID, r.Metadata["seq"])
			}
			at := place(r)
			places[at] = true
			if want != nil && at != want(key) {
				t.Fatalf("message %s of %s at %s, want %s", r.UUID, key, at, want(key))
			}
			l, ok := lasts[key]
			switch {
			case ok && l.place != at:
				t.Fatalf("%s at %s and %s", key, l.place, at)
			case ok && seq <= l.seq:
				t.Fatalf("%s: seq %d arrived after %d", key, seq, l.seq)
			}
			lasts[key] = last{place: at, seq: seq}
		}
	}
	if total != aggregates*perAggregate || len(lasts) != aggregates {
		t.Fatalf("%d messages of %d aggregates arrived, want %d of %d", total, len(lasts), aggregates*perAggregate, aggregates)
	}
	if len(places) < 2 {
		t.Fatalf("every aggregate at %v", places)
	}
}

// checkRecordKeys checks that every Kafka record's key is its message's
// ordering key as the producer set it.
func checkRecordKeys(t *testing.T, c *testenv.KafkaCollector) {
	t.Helper()
	for _, r := range c.Records() {
		if r.Key != r.Metadata[aggregateField] {
			t.Fatalf("record %s at %d/%d: key %q, want the ordering key %q", r.UUID, r.Partition, r.Offset, r.Key, r.Metadata[aggregateField])
		}
	}
}

func partitionOf(r testenv.Record) string { return strconv.Itoa(int(r.Partition)) }

func topicOf(r testenv.Record) string { return r.Topic }

// TestStoredKeyKafka: the Kafka record key is the stored ordering key, with
// kafkabatch's Publisher and TxPublisher (exactly once) at their defaults
// and with watermill-kafka's publisher and a partitioning marshaler on
// destination.Key; each key stays on one of the topic's partitions, in
// order.
func TestStoredKeyKafka(t *testing.T) {
	for _, tc := range []struct {
		name string
		dest func(t *testing.T, k *testenv.Kafka) message.Publisher
		eos  bool
	}{
		{"kafkabatch", batchPublisher, false},
		{"kafkabatch-exactly-once", func(t *testing.T, k *testenv.Kafka) message.Publisher {
			return &batchKeys{TxDestination: txPublisher(t, k, testenv.UniqueName("outbox-")), keys: map[string]string{}}
		}, true},
		{"watermill-kafka", func(t *testing.T, k *testenv.Kafka) message.Publisher { return k.KeyedPublisher(t) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, d := storedKeyOutbox(t)
			topic := testenv.UniqueName("keys_")
			k := testenv.StartKafka(t, topic)
			var c *testenv.KafkaCollector
			if tc.eos {
				c = testenv.CollectKafkaCommitted(t, k.Addrs(), topic)
			} else {
				c = k.Collect(t, topic)
			}
			dest := tc.dest(t, k)
			conformance.StartForwarder(t, forwarder.Config{DB: db, Dialect: d, Destination: dest, ExactlyOnce: tc.eos, Logger: testenv.Logger(t)})
			writeAggregates(t, db, d, topic)
			waitAggregates(t, c.Collection)
			checkRecordKeys(t, c)
			checkAggregates(t, partitionOf, nil, c.Collection)
			if bk, ok := dest.(*batchKeys); ok {
				bk.check(t, c)
			}
		})
	}
}

// batchKeys is a TxDestination that notes the TxBatch.Key each message
// was handed to the destination under.
type batchKeys struct {
	destination.TxDestination
	mu   sync.Mutex
	keys map[string]string // message UUID -> TxBatch.Key
}

func (b *batchKeys) PublishTx(ctx context.Context, partition int, batches []destination.TxBatch, progress []byte) error {
	b.mu.Lock()
	for _, batch := range batches {
		for _, m := range batch.Messages {
			b.keys[m.Message.UUID] = batch.Key
		}
	}
	b.mu.Unlock()
	return b.TxDestination.PublishTx(ctx, partition, batches, progress)
}

// check checks that every record's key is the key of its message's batch.
func (b *batchKeys) check(t *testing.T, c *testenv.KafkaCollector) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range c.Records() {
		if key, ok := b.keys[r.UUID]; !ok || key != r.Key {
			t.Fatalf("record %s: key %q, its TxBatch's key %q (handed over: %t)", r.UUID, r.Key, key, ok)
		}
	}
}

// TestStoredKeyNATS: Config.Topic on destination.Key sends each key to the
// JetStream subject of its group, in order.
func TestStoredKeyNATS(t *testing.T) {
	url := testenv.RequireNATS(t)
	db, d := storedKeyOutbox(t)
	stream := testenv.NATSStream(t)
	var cols []*testenv.Collection
	for g := range keyGroups {
		cols = append(cols, testenv.CollectNATS(t, url, fmt.Sprintf("%s.%d", stream, g)).Collection)
	}
	conformance.StartForwarder(t, forwarder.Config{
		DB: db, Dialect: d, Destination: testenv.NATSPublisher(t, url), Logger: testenv.Logger(t),
		Topic: keyGroupTopic(".", keyGroups),
	})
	writeAggregates(t, db, d, stream)
	waitAggregates(t, cols...)
	checkAggregates(t, topicOf, func(key string) string { return keyGroup(stream, ".", keyGroups, key) }, cols...)
}

// TestStoredKeyRedis: Config.Topic on destination.Key sends each key to the
// Redis stream of its group, in order, with both publishers.
func TestStoredKeyRedis(t *testing.T) {
	addr := testenv.RequireRedis(t)
	for _, pub := range redisPublishers {
		t.Run(pub.name, func(t *testing.T) {
			db, d := storedKeyOutbox(t)
			stream := testenv.RedisStream(t)
			t.Cleanup(func() { _ = testenv.DeleteRedisKeysWithPrefix(addr, stream+":") })
			var cols []*testenv.Collection
			for g := range keyGroups {
				cols = append(cols, testenv.CollectRedis(t, addr, fmt.Sprintf("%s:%d", stream, g)).Collection)
			}
			conformance.StartForwarder(t, forwarder.Config{
				DB: db, Dialect: d, Destination: pub.new(t, addr), Logger: testenv.Logger(t),
				Topic: keyGroupTopic(":", keyGroups),
			})
			writeAggregates(t, db, d, stream)
			waitAggregates(t, cols...)
			checkAggregates(t, topicOf, func(key string) string { return keyGroup(stream, ":", keyGroups, key) }, cols...)
		})
	}
}

// TestStoredKeyRabbitMQ: Config.Topic on destination.Key sends each key to
// the queue of its group (through the default exchange, whose routing key
// is the queue's name), in order, with watermill-amqp's publisher and with
// amqpbatch.
func TestStoredKeyRabbitMQ(t *testing.T) {
	url := testenv.RequireAMQP(t)
	for _, tc := range []struct {
		name string
		pub  func(t *testing.T) message.Publisher
	}{
		{"watermill-amqp", func(t *testing.T) message.Publisher { return testenv.AMQPPublisher(t) }},
		{"amqpbatch", func(t *testing.T) message.Publisher {
			p, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: url})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, d := storedKeyOutbox(t)
			topic := testenv.UniqueName("millbox_keys_")
			var queues []string
			for g := range keyGroups {
				queues = append(queues, fmt.Sprintf("%s.%d", topic, g))
			}
			t.Cleanup(func() {
				if err := testenv.DeleteAMQPQueues(url, queues...); err != nil {
					t.Logf("delete queues: %v", err)
				}
			})
			c := testenv.CollectAMQP(t, queues...) // declares them
			conformance.StartForwarder(t, forwarder.Config{
				DB: db, Dialect: d, Destination: tc.pub(t), Logger: testenv.Logger(t),
				Topic: keyGroupTopic(".", keyGroups),
			})
			writeAggregates(t, db, d, topic)
			waitAggregates(t, c.Collection)
			checkAggregates(t, topicOf, func(key string) string { return keyGroup(topic, ".", keyGroups, key) }, c.Collection)
		})
	}
}
