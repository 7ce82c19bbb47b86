package integration_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// cdcEnv is one outbox with its own publication and slot, dropped after
// the test (a leaked slot would retain WAL forever).
type cdcEnv struct {
	pool *pgxpool.Pool
	db   sqladapters.DB
	d    *postgres.Dialect
	src  cdc.Source
	cfg  forwarder.Config // with src as its Source
}

func newCDCEnv(t *testing.T) *cdcEnv {
	t.Helper()
	return newCDCEnvWith(t, postgres.Options{})
}

func newCDCEnvWith(t *testing.T, opts postgres.Options) *cdcEnv {
	t.Helper()
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	e := &cdcEnv{pool: pool, db: db}
	name := testenv.UniqueName("mbcdc_")
	e.src = cdc.Source{ConnString: testenv.PostgresURL(), Slot: name, Publication: name}
	// Registered before the schema's cleanup, so it runs after every
	// forwarder of the test stopped and before the pool closes.
	t.Cleanup(func() { dropSlot(t, pool, name) })
	e.d = testenv.PostgresDialect(t, db, pool, opts)
	e.cfg = forwarder.Config{DB: db, Dialect: e.d, Source: e.src, Logger: testenv.Logger(t)}
	return e
}

// with returns the forwarder config with the source edited.
func (e *cdcEnv) with(edit func(*cdc.Source)) forwarder.Config {
	src := e.src
	edit(&src)
	cfg := e.cfg
	cfg.Source = src
	return cfg
}

// setup creates the publication and the slot.
func (e *cdcEnv) setup(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := cdc.Setup(ctx, e.db, e.d, e.src); err != nil {
		t.Fatal(err)
	}
}

// dropSlot drops the slot and publication, ending a reader that still
// holds the slot.
func dropSlot(t testing.TB, pool *pgxpool.Pool, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, name)
		_, err := pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, name)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := pool.Exec(ctx, `DROP PUBLICATION IF EXISTS "`+name+`"`); err != nil {
		t.Logf("drop publication %s: %v", name, err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&n); err != nil || n != 0 {
		t.Errorf("slot %s still exists (%d, %v)", name, n, err)
	}
}

// start runs a forwarder with cfg until the test ends.
func (e *cdcEnv) start(t *testing.T, cfg forwarder.Config) *forwarder.Forwarder {
	t.Helper()
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(context.Background()) }()
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	if err := f.Ready(testenv.Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("ready: %v", err)
	}
	return f
}

// write commits messages of key with seq from..from+n-1 in one transaction.
func (e *cdcEnv) write(ctx context.Context, topic string, msgs ...*message.Message) error {
	tx, err := e.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return err
	}
	p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d})
	if err == nil {
		err = p.Publish(topic, msgs...)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

func keyedMsg(key string, seq int) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), []byte(key+"/"+strconv.Itoa(seq)))
	m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
	m.Metadata.Set("seq", strconv.Itoa(seq))
	return m
}

// concurrentWriters commits n messages of keys keys from 8 goroutines, each
// owning the keys k with k%8 == its number and writing each key's seq in
// order; transactions hold 1 to 20 messages and a quarter of them sleep
// before committing, so commits come out of id order. It retries a failed
// transaction (a restarted database) and returns the UUIDs.
func concurrentWriters(ctx context.Context, t *testing.T, e *cdcEnv, topic string, n, keys int, progress *atomic.Int64) []string {
	return pacedWriters(ctx, t, e, topic, n, keys, 0, progress)
}

// pacedWriters is concurrentWriters with each writer pausing pause
// between transactions.
func pacedWriters(ctx context.Context, t *testing.T, e *cdcEnv, topic string, n, keys int, pause time.Duration, progress *atomic.Int64) []string {
	const writers = 8
	var mu sync.Mutex
	var uuids []string
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := map[int]int{}
			var mine []int
			for k := w; k < keys; k += writers {
				mine = append(mine, k)
			}
			total := n / writers
			if w < n%writers {
				total++
			}
			for done := 0; done < total; {
				size := min(1+rand.IntN(20), total-done)
				msgs := make([]*message.Message, size)
				for i := range msgs {
					k := mine[rand.IntN(len(mine))]
					msgs[i] = keyedMsg("key-"+strconv.Itoa(k), seq[k])
					seq[k]++
				}
				for attempt := 0; ; attempt++ {
					err := func() error {
						tx, err := e.db.Begin(ctx, sql.TxOptions{})
						if err != nil {
							return err
						}
						p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d})
						if err == nil {
							err = p.Publish(topic, msgs...)
						}
						if err == nil && rand.IntN(4) == 0 {
							time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
						}
						if err != nil {
							sqladapters.Rollback(tx)
							return err
						}
						return tx.Commit(ctx)
					}()
					if err == nil {
						break
					}
					if ctx.Err() != nil || attempt > 600 {
						errs <- err
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				done += size
				progress.Add(int64(size))
				time.Sleep(pause)
				mu.Lock()
				for _, m := range msgs {
					uuids = append(uuids, m.UUID)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("writer: %v", err)
	}
	return uuids
}

// waitDrained waits until the outbox has no pending row (and, unless
// keep, no dead letter) and the slot is confirmed past everything written
// so far.
func (e *cdcEnv) waitDrained(t *testing.T, ctx context.Context, keep bool) {
	t.Helper()
	var target string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var pending, dead int64
		var passed bool
		err := e.pool.QueryRow(ctx, `SELECT
	(SELECT count(*) FROM `+e.d.OutboxTable()+`),
	(SELECT count(*) FROM `+e.d.Tables()[5]+`),
	(SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1)`, e.src.Slot, target).Scan(&pending, &dead, &passed)
		if err == nil && pending == 0 && passed && (keep || dead == 0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outbox not drained: pending=%d dead=%d slot confirmed past %s: %v (%v)", pending, dead, target, passed, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// cdcN is the size of the big runs: MILLBOX_CDC_N, else 50,000.
func cdcN(t *testing.T) int {
	if v := os.Getenv("MILLBOX_CDC_N"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("MILLBOX_CDC_N=%q", v)
		}
		return n
	}
	return 50000
}

// TestCDCConcurrentCommits: n messages from concurrent transactions whose
// commits come out of id order, through CDC into Kafka with the batching
// publisher: all arrive, each key in order; the table empties and the slot
// is confirmed past the end.
func TestCDCConcurrentCommits(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx := testenv.Ctx(t, 5*time.Minute)
	e.setup(t, ctx)
	cfg := e.cfg
	cp := &countingPublisher{Publisher: pub, seen: map[string]int{}}
	cfg.Destination = cp
	var errs atomic.Int64
	cfg.Hooks.OnError = func(err error) {
		if errs.Add(1) <= 5 {
			t.Logf("retried error: %v", err)
		}
	}
	e.start(t, cfg)

	n := cdcN(t)
	var written atomic.Int64
	stop := logProgress(t, "written", &written, n, col.Collection)
	start := time.Now()
	uuids := concurrentWriters(ctx, t, e, topic, n, 200, &written)
	if err := col.WaitUUIDs(ctx, uuids, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	stop()
	t.Logf("%d messages in %v (%d duplicates received, %d sent)", n, time.Since(start).Round(time.Millisecond), col.Duplicates(), cp.dups())
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
}

// logProgress logs written and received counts every few seconds until
// the returned stop is called.
func logProgress(t *testing.T, what string, written *atomic.Int64, n int, col *testenv.Collection) func() {
	done := make(chan struct{})
	var once sync.Once
	go func() {
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				t.Logf("%s %d/%d, received %d distinct", what, written.Load(), n, col.Distinct())
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// TestCDCChildProcess is the active reader of TestCDCFailoverSIGKILL when
// run as a child process; otherwise it does nothing.
func TestCDCChildProcess(t *testing.T) {
	if os.Getenv("MILLBOX_CDC_CHILD") != "1" {
		t.Skip("runs as the child process of TestCDCFailoverSIGKILL")
	}
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := postgres.MustNew(postgres.Options{Schema: os.Getenv("MILLBOX_CDC_SCHEMA")})
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{os.Getenv("MILLBOX_CDC_KAFKA")}, Options: testenv.KgoProducerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	slot := os.Getenv("MILLBOX_CDC_SLOT")
	var status time.Duration
	if v := os.Getenv("MILLBOX_CDC_STATUS"); v != "" {
		if status, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	f, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: pub,
		Source:      cdc.Source{ConnString: testenv.PostgresURL(), Slot: slot, Publication: slot, StatusInterval: status},
		Hooks: forwarder.Hooks{OnActive: func(active bool) {
			if active {
				fmt.Println("CDC-ACTIVE")
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := f.Run(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCDCFailoverSIGKILL: the active reader runs in a child process and
// is killed with SIGKILL while messages stream; a standby in this process
// takes over. Every message arrives, each key in order (redeliveries
// allowed).
func TestCDCFailoverSIGKILL(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 5*time.Minute)
	e.setup(t, ctx)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCDCChildProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "MILLBOX_CDC_CHILD=1", "MILLBOX_CDC_SCHEMA="+e.d.Schema(),
		"MILLBOX_CDC_SLOT="+e.src.Slot, "MILLBOX_CDC_KAFKA="+k.Addr())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	active := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "CDC-ACTIVE") {
				once.Do(func() { close(active) })
			}
		}
	}()
	select {
	case <-active:
	case <-time.After(60 * time.Second):
		t.Fatal("the child never became the active reader")
	}

	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	var tookOver atomic.Bool
	cfg := e.with(func(s *cdc.Source) { s.StandbyRetry = 200 * time.Millisecond })
	cfg.Hooks.OnActive = func(a bool) {
		if a {
			tookOver.Store(true)
		}
	}
	cfg.Destination = pub
	e.start(t, cfg)
	if tookOver.Load() {
		t.Fatal("the standby became active while the child led")
	}

	n := cdcN(t) / 2
	var written atomic.Int64
	stop := logProgress(t, "written", &written, n, col.Collection)
	defer stop()
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for col.Distinct() < n/3 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		_ = cmd.Process.Kill() // SIGKILL
		killedAt := time.Now()
		t.Logf("killed the active reader after %d messages arrived", col.Distinct())
		for !tookOver.Load() && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		t.Logf("the standby became active %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	}()
	uuids := concurrentWriters(ctx, t, e, topic, n, 100, &written)
	<-killed
	if err := col.WaitUUIDs(ctx, uuids, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if !tookOver.Load() {
		t.Fatal("the standby never became active")
	}
	t.Logf("%d messages, %d duplicates", n, col.Duplicates())
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
}

// TestCDCPostgresRestart restarts PostgreSQL while messages stream; the
// forwarder reconnects and resumes from the slot. It takes the database
// away from every other test: it runs only with MILLBOX_PG_RESTARTS=1.
func TestCDCPostgresRestart(t *testing.T) {
	if os.Getenv("MILLBOX_PG_RESTARTS") != "1" {
		t.Skip("restarts PostgreSQL: set MILLBOX_PG_RESTARTS=1 and run it alone")
	}
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx := testenv.Ctx(t, 5*time.Minute)
	e.setup(t, ctx)
	var sessions atomic.Int64
	cfg := e.cfg
	cfg.Hooks.OnActive = func(a bool) {
		if a {
			sessions.Add(1)
		}
	}
	cfg.Destination = pub
	e.start(t, cfg)

	n := cdcN(t) / 2
	var written atomic.Int64
	var writtenAtRestart int64
	restarted := make(chan struct{})
	go func() {
		defer close(restarted)
		for written.Load() < int64(n/3) && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		writtenAtRestart = written.Load()
		t.Logf("restarting PostgreSQL: %d messages written, %d arrived", writtenAtRestart, col.Distinct())
		start := time.Now()
		out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart").CombinedOutput()
		if err != nil {
			t.Errorf("restart postgres: %v: %s", err, out)
			// Never leave the database down for the tests that follow.
			for i := 0; i < 30; i++ {
				if out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start").CombinedOutput(); err == nil || strings.Contains(string(out), "already running") {
					break
				}
				time.Sleep(time.Second)
			}
		}
		t.Logf("restart took %v", time.Since(start).Round(time.Millisecond))
	}()
	// Paced so that most messages are written after the restart.
	uuids := pacedWriters(ctx, t, e, topic, n, 100, 5*time.Millisecond, &written)
	<-restarted
	if err := col.WaitUUIDs(ctx, uuids, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if sessions.Load() < 2 {
		t.Fatalf("the reader did not reconnect (%d sessions)", sessions.Load())
	}
	if writtenAtRestart >= int64(n) {
		t.Fatalf("the restart came after the last write: nothing was tested")
	}
	e.waitDrained(t, ctx, false)
}

// failingPublisher fails every message whose metadata matches while
// failing is set.
type failingPublisher struct {
	message.Publisher
	match   func(*message.Message) bool
	failing atomic.Bool
	fails   atomic.Int64
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for i, m := range msgs {
		if p.failing.Load() && p.match(m) {
			p.fails.Add(1)
			var err error
			if i > 0 {
				err = p.Publisher.Publish(topic, msgs[:i]...)
			}
			if err != nil {
				return err
			}
			return &forwarder.PartialError{Delivered: i, Err: errors.New("poison message refused")}
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestCDCPoisonKey: one message of one key fails every time. It is
// recorded, retried with backoff and dead-lettered after MaxAttempts; the
// other keys all arrive in order; the later messages of the poison key
// arrive in order, and only after it is dead; requeued, it arrives; the
// key then flows through the stream again.
func TestCDCPoisonKey(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 3*time.Minute)
	e.setup(t, ctx)
	poison := keyedMsg("poison", 0)
	pub := &failingPublisher{Publisher: k.KeyedPublisher(t), match: func(m *message.Message) bool { return m.UUID == poison.UUID }}
	pub.failing.Store(true)
	var mu sync.Mutex
	var failures []forwarder.FailedAttempt
	var deadAt time.Time
	cfg := e.cfg
	cfg.Destination = pub
	cfg.MaxAttempts = 3
	cfg.Retry = forwarder.ExponentialRetry{Min: 100 * time.Millisecond, Max: 200 * time.Millisecond}
	// Retries are read when due; nothing else polls during the test, so the
	// requeued row is found only through its insert in the stream.
	conformance.SetPollInterval(&cfg, time.Hour)
	cfg.Hooks.OnFailure = func(f forwarder.FailedAttempt) {
		mu.Lock()
		defer mu.Unlock()
		if f.UUID != poison.UUID {
			t.Errorf("failure recorded for %s, not the poison message", f.UUID)
		}
		failures = append(failures, f)
		if f.Dead {
			deadAt = time.Now()
		}
	}
	e.start(t, cfg)

	var uuids []string
	var later []string
	for i := range 20 {
		msgs := []*message.Message{}
		for k := range 10 {
			msgs = append(msgs, keyedMsg("key-"+strconv.Itoa(k), i))
		}
		switch {
		case i == 0:
			msgs = append(msgs, poison)
		case i < 5:
			m := keyedMsg("poison", i)
			later = append(later, m.UUID)
			msgs = append(msgs, m)
		}
		for _, m := range msgs {
			if m != poison {
				uuids = append(uuids, m.UUID)
			}
		}
		if err := e.write(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if _, ok := col.Get(poison.UUID); ok {
		t.Fatal("the poison message was delivered")
	}
	mu.Lock()
	if len(failures) != 3 || !failures[2].Dead || failures[0].Dead || failures[1].Dead {
		t.Fatalf("failures = %+v, want 3 attempts, the last one dead", failures)
	}
	for _, u := range later {
		r, _ := col.Get(u)
		if r.Arrived.Before(deadAt) {
			t.Fatalf("message %s of the poison key arrived before the poison message was dead", u)
		}
	}
	mu.Unlock()
	dls, err := listDeadLetters(ctx, e.db, e.d)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].UUID != poison.UUID || dls[0].Attempts != 3 || dls[0].LastError == "" {
		t.Fatalf("dead letters = %+v", dls)
	}

	// Requeued, it is published; afterwards the key streams again. The
	// pause lets the reads of the table that follow the last delivery
	// end: then only the requeue's insert in the stream can lead to it.
	time.Sleep(time.Second)
	pub.failing.Store(false)
	if n, err := requeueAll(ctx, e.db, e.d); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	// Generous: the requeue reaches the forwarder through the slot, whose
	// decoder reads all the cluster's WAL, other tests' bulk loads too.
	if err := col.WaitUUIDs(ctx, []string{poison.UUID}, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	next := keyedMsg("poison", 5)
	if err := e.write(ctx, topic, next); err != nil {
		t.Fatal(err)
	}
	if err := col.WaitUUIDs(ctx, []string{next.UUID}, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
	if dls, err := listDeadLetters(ctx, e.db, e.d); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after requeue: %d, %v", len(dls), err)
	}
}

// TestCDCRequeueGoesFirst: a dead letter requeued while later messages of
// its key wait in the forwarder behind a call in flight is published
// before them: the requeue, an insert under the dead letter's old id,
// hands the key to polling, which takes the waiting messages back and
// publishes the key's rows in id order.
func TestCDCRequeueGoesFirst(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 2*time.Minute)
	e.setup(t, ctx)
	poison, held := keyedMsg("k", 0), keyedMsg("k", 1)
	hang := &hangingPublisher{Publisher: k.KeyedPublisher(t), uuid: held.UUID, release: make(chan struct{}), entered: make(chan struct{})}
	pub := &failingPublisher{Publisher: hang, match: func(m *message.Message) bool { return m.UUID == poison.UUID }}
	pub.failing.Store(true)
	dead := make(chan struct{}, 1)
	cfg := e.cfg
	cfg.Destination = pub
	cfg.MaxAttempts = 1
	cfg.PublishTimeout = time.Minute
	conformance.SetPollInterval(&cfg, time.Hour)
	cfg.Hooks.OnFailure = func(f forwarder.FailedAttempt) {
		if f.Dead {
			dead <- struct{}{}
		}
	}
	e.start(t, cfg)
	if err := e.write(ctx, topic, poison); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dead:
	case <-ctx.Done():
		t.Fatal("the poison message was not dead-lettered")
	}
	pub.failing.Store(false)
	// The held message's call hangs; the later ones queue behind it.
	if err := e.write(ctx, topic, held); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hang.entered:
	case <-ctx.Done():
		t.Fatal("the held message's call never started")
	}
	var later []string
	for i := 2; i < 7; i++ {
		m := keyedMsg("k", i)
		later = append(later, m.UUID)
		if err := e.write(ctx, topic, m); err != nil {
			t.Fatal(err)
		}
	}
	// A message of another key, committed after them, arrives once the
	// stream has brought them to the forwarder: the stream is in commit
	// order.
	streamPassed := func(seq int) {
		t.Helper()
		m := keyedMsg("other", seq)
		if err := e.write(ctx, topic, m); err != nil {
			t.Fatal(err)
		}
		if err := col.WaitUUIDs(ctx, []string{m.UUID}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	streamPassed(0)
	if n, err := requeueAll(ctx, e.db, e.d); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	streamPassed(1) // the forwarder has seen the requeue
	close(hang.release)
	if err := col.WaitUUIDs(ctx, append([]string{poison.UUID, held.UUID}, later...), time.Minute); err != nil {
		t.Fatal(err)
	}
	first, _ := col.Get(poison.UUID)
	for _, u := range later {
		if r, _ := col.Get(u); r.Offset < first.Offset {
			t.Fatalf("message %s of the key arrived (offset %d) before the requeued dead letter (offset %d)", r.Metadata["seq"], r.Offset, first.Offset)
		}
	}
	e.waitDrained(t, ctx, false)
}

// TestCDCKeepForwarded: published rows move to the kept rows' table, not
// deleted; unkeyed messages flow too.
func TestCDCKeepForwarded(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 2*time.Minute)
	cfg := e.with(func(s *cdc.Source) { s.CreateIfMissing = true })
	cfg.Destination = k.KeyedPublisher(t)
	cfg.KeepForwarded = true
	e.start(t, cfg)
	var uuids []string
	for i := range 50 {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		if i%2 == 0 {
			m = keyedMsg("k", i)
		}
		uuids = append(uuids, m.UUID)
		if err := e.write(ctx, topic, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, true)
	var stamped int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM `+e.d.Tables()[6]).Scan(&stamped); err != nil || stamped != 50 {
		t.Fatalf("kept rows = %d, %v; want 50", stamped, err)
	}
}

// TestCDCBacklogAtStart: rows written before the slot existed, and before
// the forwarder started, are published by the polling path in key order,
// then new rows by the stream.
func TestCDCBacklogAtStart(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 2*time.Minute)
	var uuids []string
	write := func(from, to int) {
		for i := from; i < to; i++ {
			var msgs []*message.Message
			for k := range 5 {
				m := keyedMsg("key-"+strconv.Itoa(k), i)
				uuids = append(uuids, m.UUID)
				msgs = append(msgs, m)
			}
			if err := e.write(ctx, topic, msgs...); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, 100)
	e.setup(t, ctx)
	write(100, 200)
	cfg := e.cfg
	cp := &countingPublisher{Publisher: k.KeyedPublisher(t), seen: map[string]int{}}
	cfg.Destination = cp
	e.start(t, cfg)
	write(200, 300)
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	// Nothing failed: the hand-over from polling to the stream must not
	// publish a row twice.
	if n := cp.dups(); n > 0 {
		t.Fatalf("%d messages published twice", n)
	}
	e.waitDrained(t, ctx, false)
}

// TestCDCStartupErrors: a role without REPLICATION, a missing table and a
// missing slot are reported by Run, saying what to change.
func TestCDCStartupErrors(t *testing.T) {
	e := newCDCEnv(t)
	ctx := testenv.Ctx(t, time.Minute)
	cfg := e.cfg
	cfg.Destination = nopPublisher{}

	run := func(cfg forwarder.Config) error {
		f, err := forwarder.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return f.Run(ctx)
	}

	t.Run("not set up", func(t *testing.T) {
		err := run(cfg)
		if !errors.Is(err, cdc.ErrNotSetUp) || !strings.Contains(err.Error(), "cdc.Setup") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("missing table", func(t *testing.T) {
		c := cfg
		c.Dialect = postgres.MustNew(postgres.Options{Schema: e.d.Schema(), OutboxTable: "no_such_outbox"})
		err := run(c)
		if !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("no replication role", func(t *testing.T) {
		role := testenv.UniqueName("mbcdc_role_")
		if _, err := e.pool.Exec(ctx, `CREATE ROLE `+role+` LOGIN NOREPLICATION`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = e.pool.Exec(context.Background(), `DROP OWNED BY `+role)
			_, _ = e.pool.Exec(context.Background(), `DROP ROLE `+role)
		})
		if _, err := e.pool.Exec(ctx, `GRANT USAGE ON SCHEMA "`+e.d.Schema()+`" TO `+role); err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(testenv.PostgresURL())
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.User(role)
		pool, err := pgxpool.New(ctx, u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		c := e.with(func(s *cdc.Source) { s.ConnString = u.String() })
		c.Destination, c.DB = nopPublisher{}, pgxv5.WrapPool(pool)
		err = run(c)
		if !errors.Is(err, cdc.ErrNoReplicationRole) || !strings.Contains(err.Error(), "ALTER ROLE") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("create if missing", func(t *testing.T) {
		c := e.with(func(s *cdc.Source) { s.CreateIfMissing = true })
		c.Destination = nopPublisher{}
		f, err := forwarder.New(c)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Run(ctx) }()
		if err := f.Ready(ctx); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.src.Slot).Scan(&n); err != nil || n != 1 {
			t.Fatalf("slot count = %d, %v", n, err)
		}
		if err := cdc.Drop(ctx, e.db, e.d, e.src); err != nil {
			t.Fatal(err)
		}
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, e.src.Slot).Scan(&n); err != nil || n != 0 {
			t.Fatalf("slot count after Drop = %d, %v", n, err)
		}
	})
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// countingPublisher counts the messages handed to the destination again.
type countingPublisher struct {
	message.Publisher
	mu   sync.Mutex
	seen map[string]int
}

func (p *countingPublisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.Publisher.Publish(topic, msgs...)
	p.mu.Lock()
	for _, m := range msgs[:forwarder.DeliveredPrefix(err, len(msgs))] {
		p.seen[m.UUID]++
	}
	p.mu.Unlock()
	return err
}

func (p *countingPublisher) dups() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.seen {
		n += c - 1
	}
	return n
}

// TestCDCGauges: the active reader reports the slot's lag in bytes and the
// age of its oldest unconfirmed transaction.
func TestCDCGauges(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, time.Minute)
	e.setup(t, ctx)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	cfg := e.cfg
	cfg.Destination = k.KeyedPublisher(t)
	cfg.Telemetry.MeterProvider = mp
	f := e.start(t, cfg)
	m := keyedMsg("k", 0)
	if err := e.write(ctx, topic, m); err != nil {
		t.Fatal(err)
	}
	if err := col.WaitUUIDs(ctx, []string{m.UUID}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for len(f.Partitions()) == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, p := range data.DataPoints {
					if v, _ := p.Attributes.Value(cdc.AttrSlot); v.AsString() == e.src.Slot && p.Value >= 0 {
						seen[m.Name] = true
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range data.DataPoints {
					if v, _ := p.Attributes.Value(cdc.AttrSlot); v.AsString() == e.src.Slot && p.Value >= 0 {
						seen[m.Name] = true
					}
				}
			}
		}
	}
	if !seen[cdc.MetricSlotLag] || !seen[cdc.MetricSlotAge] {
		t.Fatalf("gauges reported: %v; want %s and %s", seen, cdc.MetricSlotLag, cdc.MetricSlotAge)
	}
}

// hangingPublisher holds every call carrying one message until release is
// closed; entered, when set, is closed when the first such call starts.
type hangingPublisher struct {
	message.Publisher
	uuid    string
	release chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (p *hangingPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.UUID == p.uuid {
			if p.entered != nil {
				p.once.Do(func() { close(p.entered) })
			}
			<-p.release
			break
		}
	}
	return p.Publisher.Publish(topic, msgs...)
}

// TestCDCPublishTimeout: a call that hangs past PublishTimeout counts as a
// failed attempt and frees its slot: with Concurrency 1 every other key
// still arrives while it hangs; its key waits for it, then arrives in
// order.
func TestCDCPublishTimeout(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 2*time.Minute)
	e.setup(t, ctx)
	stuck := keyedMsg("slow", 0)
	pub := &hangingPublisher{Publisher: k.KeyedPublisher(t), uuid: stuck.UUID, release: make(chan struct{})}
	released := false
	t.Cleanup(func() {
		if !released {
			close(pub.release)
		}
	})
	var timeouts atomic.Int64
	cfg := e.cfg
	cfg.Destination = pub
	cfg.Concurrency = 1
	cfg.PublishTimeout = 200 * time.Millisecond
	cfg.Retry = forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 100 * time.Millisecond}
	cfg.MaxAttempts = -1
	cfg.Hooks.OnFailure = func(f forwarder.FailedAttempt) {
		if f.UUID == stuck.UUID && strings.Contains(f.Error, "PublishTimeout") {
			timeouts.Add(1)
		}
	}
	e.start(t, cfg)

	slow := []string{stuck.UUID}
	if err := e.write(ctx, topic, stuck); err != nil {
		t.Fatal(err)
	}
	var others []string
	for i := range 20 {
		msgs := []*message.Message{keyedMsg("slow", i+1)}
		slow = append(slow, msgs[0].UUID)
		for k := range 5 {
			m := keyedMsg("key-"+strconv.Itoa(k), i)
			others = append(others, m.UUID)
			msgs = append(msgs, m)
		}
		if err := e.write(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, others, time.Minute); err != nil {
		t.Fatalf("other keys held back by a hanging call: %v", err)
	}
	for _, u := range slow {
		if _, ok := col.Get(u); ok {
			t.Fatalf("message %s of the hanging key arrived while its first call hangs", u)
		}
	}
	if timeouts.Load() == 0 {
		t.Fatal("no attempt was recorded for the hanging call")
	}
	close(pub.release)
	released = true
	if err := col.WaitUUIDs(ctx, slow, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
}

// TestCDCPartitionedOutbox: the time-partitioned outbox streams through
// its root table (publish_via_partition_root).
func TestCDCPartitionedOutbox(t *testing.T) {
	e := newCDCEnvWith(t, postgres.Options{Partitioned: &postgres.PartitionOptions{}})
	topic := testenv.UniqueName("cdc_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 2*time.Minute)
	e.setup(t, ctx)
	cfg := e.cfg
	cfg.Destination = k.KeyedPublisher(t)
	e.start(t, cfg)
	var uuids []string
	for i := range 50 {
		var msgs []*message.Message
		for k := range 4 {
			m := keyedMsg("key-"+strconv.Itoa(k), i)
			uuids = append(uuids, m.UUID)
			msgs = append(msgs, m)
		}
		if err := e.write(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
}

// TestCDCRabbitMQ streams to RabbitMQ through the amqpbatch publisher:
// every message arrives, each key in order, none twice.
func TestCDCRabbitMQ(t *testing.T) {
	url := testenv.RequireAMQP(t)
	e := newCDCEnv(t)
	queue := testenv.AMQPQueue(t)
	col, err := testenv.NewAMQPCollector(url, queue)
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	pub, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	ctx := testenv.Ctx(t, 2*time.Minute)
	e.setup(t, ctx)
	cfg := e.cfg
	cfg.Destination = pub
	e.start(t, cfg)
	const keys, per = 50, 100
	conformance.WriteKeyed(t, ctx, pgxSource(e.db), e.d, queue, keys, per, 10, 4)
	if err := col.WaitN(ctx, keys*per, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if d := col.Duplicates(); d != 0 {
		t.Fatalf("%d duplicates in a clean run", d)
	}
	e.waitDrained(t, ctx, false)
}

// cdcSource returns the change-data-capture source of d's outbox, one
// slot per outbox, for the conformance suites: forwarders of one outbox
// share its slot.
func cdcSource(pool *pgxpool.Pool) func(t testing.TB, d sqladapters.Dialect) forwarder.Source {
	var mu sync.Mutex
	slots := map[sqladapters.Dialect]string{}
	return func(t testing.TB, d sqladapters.Dialect) forwarder.Source {
		mu.Lock()
		defer mu.Unlock()
		name, ok := slots[d]
		if !ok {
			name = testenv.UniqueName("mbcdc_")
			slots[d] = name
			t.Cleanup(func() { dropSlot(t, pool, name) })
		}
		return cdc.Source{ConnString: testenv.PostgresURL(), Slot: name, Publication: name, CreateIfMissing: true, StandbyRetry: 100 * time.Millisecond}
	}
}

// The forwarder suite (its fault suite included) with the
// change-data-capture source: every promise of the polling forwarder
// holds for it too.
func TestCDCForwarderConformance(t *testing.T) {
	env := pgEnv(t)
	env.ForwarderSource = cdcSource(testenv.Postgres(t))
	conformance.Forwarder(t, env)
}
