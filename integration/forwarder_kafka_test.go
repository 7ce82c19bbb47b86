package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// consumeGroup reads topic with a watermill-kafka consumer group, the way a
// user's service would, and records every delivery.
func consumeGroup(t *testing.T, addrs []string, topic string) *conformance.Recorder {
	t.Helper()
	_ = testenv.KafkaSaramaConfig() // turns sarama's go-metrics off before any client starts
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           testenv.KeyMarshaler(),
		ConsumerGroup:         testenv.UniqueName("group_"),
		OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	rec := conformance.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			_ = rec.Publish(topic, m)
			m.Ack()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = sub.Close()
		<-done
	})
	return rec
}

// pgxSource begins transactions on db (any adapter, despite the name).
func pgxSource(db sqladapters.DB) conformance.TxSource {
	return conformance.TxSource{Name: "db", Begin: beginOn(db)}
}

// TestForwarderKafkaThreeInstances: 3 forwarders, 200 keys, 50,000
// messages from concurrent transactions, into a Kafka consumer group; with
// watermill-kafka's publisher and with the batching kafkabatch publisher.
func TestForwarderKafkaThreeInstances(t *testing.T) {
	for _, tc := range []struct {
		name string
		pub  func(t *testing.T, k *testenv.Kafka) message.Publisher
	}{
		{"watermill-kafka", func(t *testing.T, k *testenv.Kafka) message.Publisher { return k.KeyedPublisher(t) }},
		{"kafkabatch", batchPublisher},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testenv.Postgres(t)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
			k := testenv.StartKafka(t, "orders")
			rec := consumeGroup(t, k.Addrs(), "orders")

			var fs []*forwarder.Forwarder
			for range 3 {
				fs = append(fs, conformance.StartForwarder(t, forwarder.Config{
					DB:          db,
					Dialect:     d,
					Destination: tc.pub(t, k),
					Logger:      testenv.Logger(t),
					Source:      forwarder.Polling{LeaseTTL: 3 * time.Second, Partitions: 12},
				}))
			}
			conformance.WaitOwned(t, fs, 12, true)

			const keys, perKey = 200, 250
			conformance.WriteKeyed(t, context.Background(), pgxSource(db), d, "orders", keys, perKey, 10, 8)
			rec.WaitFor(t, keys*perKey, 3*time.Minute)
			conformance.CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
			time.Sleep(500 * time.Millisecond)
			if got := len(rec.Messages()); got != keys*perKey {
				t.Fatalf("%d deliveries of %d messages: a clean run must not duplicate", got, keys*perKey)
			}
			for _, f := range fs {
				if len(f.Partitions()) == 0 {
					t.Fatalf("an instance ended with no partitions")
				}
			}
		})
	}
}

// batchPublisher is a kafkabatch publisher to k, closed after the test.
func batchPublisher(t *testing.T, k *testenv.Kafka) message.Publisher {
	p, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestForwarderKafkaOutage stops the broker for 10 s while messages keep
// being written; forwarding resumes by itself and nothing is lost, and the
// forwarder stays nearly idle while the broker is down.
func TestForwarderKafkaOutage(t *testing.T) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	k := testenv.StartKafka(t, "outage")
	conformance.StartForwarder(t, forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: k.KeyedPublisher(t),
		Retry:       forwarder.ExponentialRetry{Min: 200 * time.Millisecond, Max: 2 * time.Second},
		MaxAttempts: -1,
		Logger:      testenv.Logger(t),
	})
	ctx := context.Background()
	conformance.WriteKeyed(t, ctx, pgxSource(db), d, "outage", 20, 50, 10, 2)

	k.Stop()
	cpu0 := cpuTime()
	wall0 := time.Now()
	conformance.WriteKeyed(t, ctx, pgxSource(db), d, "outage2", 20, 50, 10, 2)
	time.Sleep(10*time.Second - time.Since(wall0))
	cpu := (cpuTime() - cpu0).Seconds() / time.Since(wall0).Seconds()
	t.Logf("CPU while the broker was down: %.1f%% of one core", 100*cpu)
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	rec := conformance.NewRecorder()
	for _, topic := range []string{"outage", "outage2"} {
		r := consumeGroup(t, k.Addrs(), topic)
		defer func() {
			for _, m := range r.Messages() {
				_ = rec.Publish(m.Topic, &message.Message{UUID: m.UUID, Metadata: m.Metadata})
			}
		}()
		r.WaitFor(t, 1000, 2*time.Minute)
		conformance.CheckKeyOrder(t, r.Messages(), forwarder.DefaultKeyMetadataField)
	}
	// The forwarder process does nothing useful while the broker is down;
	// it must not spin (a generous bound: half a core).
	if cpu > 0.5 {
		t.Fatalf("forwarder used %.0f%% of a core while the broker was down", 100*cpu)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestForwarderKafkaPoisonMessage: the Kafka publisher rejects one oversized
// message every time (over the 1 MiB Kafka default); it ends in the dead
// letters with the publisher's error while every other message, on the
// same topic and other keys, is delivered.
func TestForwarderKafkaPoisonMessage(t *testing.T) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	k := testenv.StartKafka(t, "poison")
	// The batching publisher sends the poison message in one batch with
	// others of its key; the forwarder must still blame the right row.
	conformance.StartForwarder(t, forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: batchPublisher(t, k),
		Retry:       forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		MaxAttempts: 3,
		Logger:      testenv.Logger(t),
	})
	ctx := context.Background()
	tx, err := db.Begin(ctx, sqlTxOptions)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	big := message.NewMessage(watermill.NewUUID(), make([]byte, 3<<20)) // over Kafka's 1 MiB default
	big.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-3")
	big.Metadata.Set("seq", "-1")
	if err := pub.Publish("poison", big); err != nil {
		t.Fatal(err)
	}
	tx.Commit(ctx)
	conformance.WriteKeyed(t, ctx, pgxSource(db), d, "poison", 10, 20, 5, 2)
	rec := consumeGroup(t, k.Addrs(), "poison")
	rec.WaitFor(t, 200, time.Minute)
	var dead []sqladapters.DeadLetter
	for deadline := time.Now().Add(time.Minute); len(dead) == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if dead, err = listDeadLetters(ctx, db, d); err != nil {
			t.Fatal(err)
		}
	}
	if len(dead) != 1 || dead[0].UUID != big.UUID || dead[0].Attempts != 3 || !strings.Contains(dead[0].LastError, "larger than") {
		t.Fatalf("dead letters: %d, first %+v", len(dead), deadSummary(dead))
	}
}

func deadSummary(dead []sqladapters.DeadLetter) string {
	var b strings.Builder
	for _, d := range dead {
		fmt.Fprintf(&b, "[%s attempts=%d err=%q] ", d.UUID, d.Attempts, d.LastError)
	}
	return b.String()
}

// crashDB is one database the crash test runs on: how the parent writes,
// and the environment the child needs to reopen the same outbox.
type crashDB struct {
	db      sqladapters.DB
	dialect sqladapters.Dialect
	env     []string
}

func crashDatabase(t *testing.T, name string) crashDB {
	switch name {
	case "postgres":
		pool := testenv.Postgres(t)
		db := pgxv5.WrapPool(pool)
		d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
		return crashDB{db, d, []string{"MILLBOX_CRASH_SCHEMA=" + d.Schema()}}
	case "mysql":
		sqlDB := testenv.MySQL(t)
		d := testenv.MySQLDialect(t, sqlDB, mysql.Options{})
		return crashDB{stdsql.WrapDB(sqlDB), d, []string{"MILLBOX_CRASH_OUTBOX=" + d.Options().OutboxTable, "MILLBOX_CRASH_INBOX=" + d.Options().InboxTable}}
	case "sqlite":
		path := testenv.SQLitePath(t)
		db := stdsql.WrapDB(testenv.SQLite(t, path))
		d := testenv.SQLiteDialect(t, db, sqlite.Options{})
		return crashDB{db, d, []string{"MILLBOX_CRASH_SQLITE=" + path, "MILLBOX_CRASH_OUTBOX=" + d.Options().OutboxTable, "MILLBOX_CRASH_INBOX=" + d.Options().InboxTable}}
	}
	t.Fatalf("unknown database %q", name)
	return crashDB{}
}

// childOutbox reopens, in the child process, the outbox crashDatabase
// made; close closes the database.
func childOutbox(ctx context.Context, name string) (db sqladapters.DB, d sqladapters.Dialect, close func(), err error) {
	switch name {
	case "postgres":
		pool, err := pgxpool.New(ctx, testenv.PostgresURL())
		if err != nil {
			return nil, nil, nil, err
		}
		return pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{Schema: os.Getenv("MILLBOX_CRASH_SCHEMA")}), pool.Close, nil
	case "mysql":
		sqlDB, err := sql.Open("mysql", testenv.MySQLDSN())
		if err != nil {
			return nil, nil, nil, err
		}
		return stdsql.WrapDB(sqlDB), mysql.MustNew(mysql.Options{
			OutboxTable: os.Getenv("MILLBOX_CRASH_OUTBOX"), InboxTable: os.Getenv("MILLBOX_CRASH_INBOX")}), func() { sqlDB.Close() }, nil
	case "sqlite":
		sqlDB, err := modernc.Open(os.Getenv("MILLBOX_CRASH_SQLITE"), modernc.Config{})
		if err != nil {
			return nil, nil, nil, err
		}
		return stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{
			OutboxTable: os.Getenv("MILLBOX_CRASH_OUTBOX"), InboxTable: os.Getenv("MILLBOX_CRASH_INBOX")}), func() { sqlDB.Close() }, nil
	}
	return nil, nil, nil, fmt.Errorf("unknown database %q", name)
}

// TestForwarderCrash kills forwarder processes with SIGKILL at random
// moments while 20,000 messages flow: nothing is lost, per-key order of
// first deliveries holds, and duplicates (batches in flight at a kill) are
// counted. It runs on every database.
func TestForwarderCrash(t *testing.T) {
	for _, name := range []string{"postgres", "mysql", "sqlite"} {
		t.Run(name, func(t *testing.T) { testForwarderCrash(t, name) })
	}
}

func testForwarderCrash(t *testing.T, name string) {
	c := crashDatabase(t, name)
	k := testenv.StartKafka(t, "crash")
	rec := consumeGroup(t, k.Addrs(), "crash")
	ctx := context.Background()

	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(append(os.Environ(),
			crashChildEnv+"="+name,
			"MILLBOX_CRASH_KAFKA="+k.Addr(),
		), c.env...)
		out := testenv.LogWriter(t, "forwarder process: ")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	written := make(chan struct{})
	go func() {
		defer close(written)
		conformance.WriteKeyed(t, ctx, pgxSource(c.db), c.dialect, "crash", 100, 200, 5, 4)
	}()
	kills := 0
	for i := 0; i < 6; i++ {
		cmd := start()
		time.Sleep(time.Duration(700+i*173%500) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		kills++
	}
	<-written
	last := start()
	defer func() {
		_ = last.Process.Signal(syscall.SIGTERM)
		_ = last.Wait()
	}()
	rec.WaitFor(t, 20000, 3*time.Minute)
	conformance.CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	dups := len(rec.Messages()) - rec.Distinct()
	t.Logf("%s: %d kills, 20000 messages, 0 lost, %d duplicates from batches in flight at a kill", name, kills, dups)
	if dups > kills*2*forwarder.DefaultBatchSize {
		t.Fatalf("%d duplicates is more than the batches in flight at %d kills", dups, kills)
	}
}

// crashChildEnv names the database of the forwarder process
// TestForwarderCrash starts: TestMain runs forwarderCrashChild instead of
// the tests when it is set.
const crashChildEnv = "MILLBOX_CRASH_CHILD"

// forwarderCrashChild is the forwarder process TestForwarderCrash kills.
// It runs outside the testing framework, so that being killed, or stopped
// with SIGTERM at the end, reports no test result of its own.
func forwarderCrashChild(name string) error {
	ctx, stop := signalContext()
	defer stop()
	db, d, closeDB, err := childOutbox(ctx, name)
	if err != nil {
		return err
	}
	defer closeDB()
	pub, err := testenv.NewKafkaPublisher([]string{os.Getenv("MILLBOX_CRASH_KAFKA")}, true)
	if err != nil {
		return err
	}
	defer pub.Close()
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, DelayedPollInterval: 50 * time.Millisecond, Logger: logger, Source: forwarder.Polling{PollInterval: 50 * time.Millisecond, LeaseTTL: time.Second}})
	if err != nil {
		return err
	}
	if err := f.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}
