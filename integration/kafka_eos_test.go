package integration_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// txPublisher returns a transactional kafkabatch publisher for the outbox
// named id, closed after the test.
func txPublisher(t testing.TB, k *testenv.Kafka, id string) *kafkabatch.TxPublisher {
	t.Helper()
	p, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{
		Config:          kafkabatch.Config{Brokers: k.Addrs(), DeliveryTimeout: 5 * time.Second, Options: testenv.KgoProducerOptions()},
		TransactionalID: id,
		ControlTopic:    "progress-" + id,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// eosPostgres is a Postgres outbox of the test's own.
func eosPostgres(t *testing.T) (*pgxpool.Pool, sqladapters.DB, *postgres.Dialect) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	return pool, db, testenv.PostgresDialect(t, db, pool, postgres.Options{})
}

// checkExactlyOnce waits for n distinct messages and checks that each
// arrived once and every key in order.
func checkExactlyOnce(t *testing.T, c *testenv.KafkaCollector, n int, timeout time.Duration) {
	t.Helper()
	checkOnce(t, c, n, timeout)
	if err := c.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
}

// checkOnce waits for n distinct messages and checks that each arrived
// once.
func checkOnce(t *testing.T, c *testenv.KafkaCollector, n int, timeout time.Duration) {
	t.Helper()
	if err := c.WaitN(context.Background(), n, timeout); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // a duplicate would follow its original closely
	if d := c.Duplicates(); d != 0 {
		seen := map[string]testenv.Record{}
		var dups []string
		for _, r := range c.Records() {
			if f, ok := seen[r.UUID]; ok {
				if len(dups) < 10 {
					dups = append(dups, fmt.Sprintf("%s seq %s at %d/%d and %d/%d (%v apart)", r.Key, r.Metadata["seq"], f.Partition, f.Offset, r.Partition, r.Offset, r.Arrived.Sub(f.Arrived).Round(time.Millisecond)))
				}
				continue
			}
			seen[r.UUID] = r
		}
		t.Fatalf("%d duplicates among %d deliveries of %d messages: %s", d, c.Len(), n, strings.Join(dups, "; "))
	}
	if c.Distinct() != n {
		t.Fatalf("%d distinct messages, want %d", c.Distinct(), n)
	}
}

// eosEnv is an outbox, a kfake cluster and the names of one exactly-once
// test; with cdcMode the forwarders use the CDC source.
type eosEnv struct {
	pool      *pgxpool.Pool
	db        sqladapters.DB
	d         *postgres.Dialect
	k         *testenv.Kafka
	topic, id string
	slot      string // CDC
}

func newEOSEnv(t *testing.T, cdcMode bool) *eosEnv {
	t.Helper()
	pool, db, d := eosPostgres(t)
	e := &eosEnv{pool: pool, db: db, d: d, k: testenv.StartKafka(t), topic: testenv.UniqueName("eos_"), id: testenv.UniqueName("outbox-")}
	if cdcMode {
		e.slot = testenv.UniqueName("mbeos_")
		// Registered before the forwarders', so it runs after they stopped.
		t.Cleanup(func() { dropSlot(t, pool, e.slot) })
	}
	return e
}

func (e *eosEnv) source() forwarder.Source {
	if e.slot != "" {
		return cdc.Source{ConnString: testenv.PostgresURL(), Slot: e.slot, Publication: e.slot, CreateIfMissing: true, StandbyRetry: 100 * time.Millisecond}
	}
	return forwarder.Polling{Partitions: 8, LeaseTTL: 2 * time.Second}
}

// start runs an exactly-once forwarder until the test ends.
func (e *eosEnv) start(t *testing.T, edit func(*forwarder.Config)) *forwarder.Forwarder {
	t.Helper()
	cfg := forwarder.Config{
		DB: e.db, Dialect: e.d, Destination: txPublisher(t, e.k, e.id), ExactlyOnce: true, Source: e.source(),
		Retry: forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
	}
	if edit != nil {
		edit(&cfg)
	}
	return conformance.StartForwarder(t, cfg)
}

func eosModes(t *testing.T, test func(t *testing.T, cdcMode bool)) {
	t.Run("polling", func(t *testing.T) { test(t, false) })
	t.Run("cdc", func(t *testing.T) { test(t, true) })
}

// TestExactlyOnceKafka: two forwarders in exactly-once mode share an
// outbox; a read_committed consumer sees every message once, each key in
// order, and the outbox ends empty.
func TestExactlyOnceKafka(t *testing.T) {
	eosModes(t, func(t *testing.T, cdcMode bool) {
		e := newEOSEnv(t, cdcMode)
		c := testenv.CollectKafkaCommitted(t, e.k.Addrs(), e.topic)
		e.start(t, nil)
		e.start(t, nil)
		ctx := context.Background()
		conformance.WriteKeyed(t, ctx, pgxSource(e.db), e.d, e.topic, 50, 40, 5, 4)
		checkExactlyOnce(t, c, 2000, time.Minute)
		waitEmpty(t, e.pool, e.d)
	})
}

// TestExactlyOnceKafkaDatabases is TestExactlyOnceKafka's polling case on
// MariaDB and SQLite.
func TestExactlyOnceKafkaDatabases(t *testing.T) {
	for _, name := range []string{"mysql", "sqlite"} {
		t.Run(name, func(t *testing.T) {
			c := crashDatabase(t, name)
			k := testenv.StartKafka(t)
			topic, id := testenv.UniqueName("eos_"), testenv.UniqueName("outbox-")
			col := testenv.CollectKafkaCommitted(t, k.Addrs(), topic)
			for range 2 {
				conformance.StartForwarder(t, forwarder.Config{
					DB: c.db, Dialect: c.dialect, Destination: txPublisher(t, k, id), ExactlyOnce: true,
					Source: forwarder.Polling{Partitions: 8, LeaseTTL: 2 * time.Second},
				})
			}
			ctx := context.Background()
			conformance.WriteKeyed(t, ctx, pgxSource(c.db), c.dialect, topic, 20, 25, 5, 2)
			checkExactlyOnce(t, col, 500, time.Minute)
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				rows := conformance.ReadPending(t, ctx, c.db, c.dialect)
				if len(rows) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d rows left in the outbox", len(rows))
				}
			}
		})
	}
}

// waitEmpty waits until the outbox holds no row.
func waitEmpty(t *testing.T, pool *pgxpool.Pool, d *postgres.Dialect) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for n := pendingCount(t, pool, d); n != 0; n = pendingCount(t, pool, d) {
		if time.Now().After(deadline) {
			t.Fatalf("%d rows left in the outbox", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExactlyOnceKafkaBrokerRestart stops the broker while a keyed stream
// flows and starts it again: nothing is lost, nothing arrives twice, each
// key keeps its order.
func TestExactlyOnceKafkaBrokerRestart(t *testing.T) {
	eosModes(t, func(t *testing.T, cdcMode bool) {
		e := newEOSEnv(t, cdcMode)
		c := testenv.CollectKafkaCommitted(t, e.k.Addrs(), e.topic)
		e.start(t, nil)
		e.start(t, nil)
		ctx := testenv.Ctx(t, 5*time.Minute)
		const keys, perKey = 50, 60
		var written atomic.Int64
		wdone := make(chan error, 1)
		go func() { wdone <- writeKeyedStream(ctx, e.db, e.d, e.topic, keys, perKey, 500, &written) }()
		for written.Load() < keys*perKey/3 {
			time.Sleep(10 * time.Millisecond)
		}
		e.k.Stop()
		t.Logf("broker stopped: %d written, %d delivered", written.Load(), c.Distinct())
		time.Sleep(3 * time.Second)
		if err := e.k.Restart(); err != nil {
			t.Fatal(err)
		}
		t.Logf("broker back: %d written, %d delivered", written.Load(), c.Distinct())
		if err := <-wdone; err != nil {
			t.Fatal(err)
		}
		checkExactlyOnce(t, c, keys*perKey, 2*time.Minute)
		waitEmpty(t, e.pool, e.d)
	})
}

// TestExactlyOnceKafkaMessageTooLarge: a key's message is larger than the
// topic accepts, so the broker refuses it inside a transaction with other
// keys' messages. The other messages arrive once; the large one is tried
// alone, retried and dead-lettered as usual, and the later messages of
// its key follow. Requeued once the topic takes it, it arrives once.
func TestExactlyOnceKafkaMessageTooLarge(t *testing.T) {
	eosModes(t, func(t *testing.T, cdcMode bool) {
		e := newEOSEnv(t, cdcMode)
		if err := e.k.Cluster().CreateTopic(e.topic, 4, map[string]string{"max.message.bytes": "65536"}); err != nil {
			t.Fatal(err)
		}
		c := testenv.CollectKafkaCommitted(t, e.k.Addrs(), e.topic)
		var sharedFailure atomic.Int64 // the most messages of a transaction that failed
		e.start(t, func(c *forwarder.Config) {
			c.MaxAttempts = 3
			c.Hooks.OnBatch = func(st forwarder.BatchStats) {
				if st.Failed > 0 && int64(st.Messages) > sharedFailure.Load() {
					sharedFailure.Store(int64(st.Messages))
				}
			}
		})
		ctx := testenv.Ctx(t, 3*time.Minute)
		const keys, perKey = 20, 10
		payload := make([]byte, 100<<10)
		_, _ = rand.Read(payload) // incompressible: the client compresses batches
		big := message.NewMessage(watermill.NewUUID(), payload)
		for s := range perKey {
			tx, err := e.db.Begin(ctx, sqlTxOptions)
			if err != nil {
				t.Fatal(err)
			}
			pub, _ := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d})
			var msgs []*message.Message
			for k := range keys {
				m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d-%d", k, s)))
				if k == 3 && s == 4 {
					m = big
				}
				m.Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprintf("key-%d", k))
				m.Metadata.Set("seq", strconv.Itoa(s))
				msgs = append(msgs, m)
			}
			if err := pub.Publish(e.topic, msgs...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
		}
		checkExactlyOnce(t, c, keys*perKey-1, time.Minute)
		if _, ok := c.Get(big.UUID); ok {
			t.Fatal("the large message arrived")
		}
		if sharedFailure.Load() < 2 {
			t.Fatalf("the large message was never refused in a transaction with other messages (at most %d in a failed one): the test proves less than it says", sharedFailure.Load())
		}
		var dead []sqladapters.DeadLetter
		for deadline := time.Now().Add(time.Minute); len(dead) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			var err error
			if dead, err = listDeadLetters(ctx, e.db, e.d); err != nil {
				t.Fatal(err)
			}
		}
		if len(dead) != 1 || dead[0].UUID != big.UUID || dead[0].Attempts != 3 || !strings.Contains(dead[0].LastError, "MESSAGE_TOO_LARGE") {
			t.Fatalf("dead letters: %d, %s", len(dead), deadSummary(dead))
		}
		// The topic takes it now; requeued, it arrives once (after the
		// later messages of its key, as a requeued dead letter does).
		if err := alterTopicConfig(ctx, e.k, e.topic, "max.message.bytes", "1048576"); err != nil {
			t.Fatal(err)
		}
		if n, err := requeueAll(ctx, e.db, e.d); err != nil || n != 1 {
			t.Fatalf("requeue: %d, %v", n, err)
		}
		checkOnce(t, c, keys*perKey, time.Minute)
		waitEmpty(t, e.pool, e.d)
	})
}

// alterTopicConfig sets one config of topic.
func alterTopicConfig(ctx context.Context, k *testenv.Kafka, topic, name, value string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Addrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeTopic, topic
	c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	c.Name, c.Value, c.Op = name, kmsg.StringPtr(value), kmsg.IncrementalAlterConfigOpSet
	r.Configs = append(r.Configs, c)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return err
	}
	for _, r := range resp.Resources {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return fmt.Errorf("alter %s of %s: %w", name, topic, err)
		}
	}
	return nil
}

// TestExactlyOnceConfigErrors: exactly-once mode with a destination that
// cannot publish in transactions, with a control topic that is not
// compacted, or with brokers that refuse transactions, fails at start
// with an error that says so, and nothing is sent.
func TestExactlyOnceConfigErrors(t *testing.T) {
	_, db, d := eosPostgres(t)
	k := testenv.StartKafka(t)
	plain := batchPublisher(t, k)
	_, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: plain, ExactlyOnce: true})
	if !errors.Is(err, forwarder.ErrInvalidConfig) || !strings.Contains(err.Error(), "TxDestination") {
		t.Fatalf("a publisher without transactions: %v", err)
	}

	ctx := testenv.Ctx(t, time.Minute)
	topic := testenv.UniqueName("eoscfg_")
	c := testenv.CollectKafka(t, k.Addrs(), topic) // read_uncommitted: sees any record written
	conformance.WriteKeyed(t, ctx, pgxSource(db), d, topic, 5, 4, 2, 1)
	run := func(pub *kafkabatch.TxPublisher) error {
		t.Helper()
		f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, ExactlyOnce: true, Logger: testenv.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return f.Run(rctx)
	}

	id := testenv.UniqueName("outbox-")
	if err := k.Cluster().CreateTopic("progress-"+id, 1, map[string]string{"cleanup.policy": "delete"}); err != nil {
		t.Fatal(err)
	}
	err = run(txPublisher(t, k, id))
	if !errors.Is(err, sqladapters.ErrInvalidConfig) || !strings.Contains(err.Error(), `cleanup.policy="delete"`) {
		t.Fatalf("a control topic that is not compacted: %v", err)
	}
	t.Logf("control topic not compacted: %v", err)

	id = testenv.UniqueName("outbox-")
	fault := k.Cluster().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.InitProducerID}, Err: kerr.TransactionalIDAuthorizationFailed, Count: -1})
	err = run(txPublisher(t, k, id))
	fault.Remove()
	if err == nil || !strings.Contains(err.Error(), "did not grant a transaction") || !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
		t.Fatalf("brokers that refuse transactions: %v", err)
	}
	t.Logf("brokers refuse transactions: %v", err)

	time.Sleep(time.Second)
	if c.Len() != 0 {
		t.Fatalf("%d records reached the topic", c.Len())
	}
	if rows := conformance.ReadPending(t, ctx, db, d); len(rows) != 20 {
		t.Fatalf("%d rows pending, want all 20", len(rows))
	}
}
