package integration_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Behind PgBouncer in transaction pooling, with the producer in another
// process (so no in-process wakeup helps): the default mode delivers
// everything in order; a listener on a pooled connection is found out,
// said so, and covered by watching the outbox; a listener with a direct
// connection works; and no server connection is left listening.
//
// The producer runs as TestPgBouncerProducerChild in a child process.
const (
	pgbChildEnv  = "MILLBOX_PGB_PRODUCER" // schema,topic,first,n,keys,every,notify
	pgbSentField = "sent_unix_nano"
	pgbSeqField  = "seq"
)

func TestPgBouncer(t *testing.T) {
	if os.Getenv(pgbChildEnv) != "" {
		t.Skip("producer process")
	}
	bouncer := testenv.PgBouncer(t, testenv.PgBouncerURL())
	direct := testenv.Postgres(t)

	t.Run("DefaultMode", func(t *testing.T) {
		o := newPgbOutbox(t, direct, bouncer, false)
		run := o.forward(t, pgxv5.WrapPool(bouncer), forwarder.Config{})
		o.produce(t, 600, 12, time.Millisecond)
		o.wait(t, 600)
		run.stop(t)
		if run.lostCount() != 0 {
			t.Fatalf("default mode reported lost notifications: %v", run.errs())
		}
	})

	t.Run("NotifyPooledListener", func(t *testing.T) {
		o := newPgbOutbox(t, direct, bouncer, true)
		poll := time.Second
		run := o.forward(t, pgxv5.WrapPool(bouncer), forwarder.Config{Source: forwarder.Polling{PollInterval: poll}, DelayedPollInterval: poll})
		run.waitLost(t)
		o.produce(t, 200, 8, 5*time.Millisecond)
		o.wait(t, 200)
		// The guarantee: without notifications no message waits longer
		// than the poll interval (the watch makes it milliseconds).
		o.checkLatency(t, poll+3*time.Second)
		run.stop(t)
		if !run.loggedError("notifications do not arrive") {
			t.Fatalf("no error log about lost notifications; logs: %s", run.logs.text(watermill.InfoLogLevel))
		}
		t.Logf("logged:\n%s", run.logs.text(watermill.InfoLogLevel))
		logged := run.logs.text(watermill.ErrorLogLevel)
		if !strings.Contains(logged, "PgBouncer") {
			t.Fatalf("the error log does not name the likely cause: %s", logged)
		}
		if st := run.lastStatusError; !strings.Contains(st, "notifications do not arrive") {
			t.Fatalf("Status.LastError = %q, want the lost notifications", st)
		}
		requireNoServerListening(t, testenv.PgBouncerURL(), o.d.NotifyChannel(), "after the forwarder stopped")
	})

	t.Run("NotifyDirectListener", func(t *testing.T) {
		o := newPgbOutbox(t, direct, bouncer, true)
		db := pgxv5.WrapPool(bouncer, pgxv5.ListenOn(testenv.PostgresURL()))
		run := o.forward(t, db, forwarder.Config{Source: forwarder.Polling{NotifyProbeInterval: 50 * time.Millisecond}})
		o.produce(t, 300, 8, 2*time.Millisecond)
		o.wait(t, 300)
		run.stop(t)
		if n := run.lostCount(); n != 0 {
			t.Fatalf("a direct listener reported lost notifications %d times: %v", n, run.errs())
		}
		if run.loggedError("notifications") {
			t.Fatalf("unexpected error log: %s", run.logs.text(watermill.ErrorLogLevel))
		}
	})

	t.Run("NotifyListenerOnDirectPool", func(t *testing.T) {
		// The forwarder's own pool goes to Postgres directly: its
		// listener takes a connection from it, and that works.
		o := newPgbOutbox(t, direct, bouncer, true)
		run := o.forward(t, pgxv5.WrapPool(direct), forwarder.Config{Source: forwarder.Polling{NotifyProbeInterval: 50 * time.Millisecond}})
		o.produce(t, 100, 8, 2*time.Millisecond)
		o.wait(t, 100)
		run.stop(t)
		if n := run.lostCount(); n != 0 {
			t.Fatalf("a listener on a direct pool reported lost notifications %d times: %v", n, run.errs())
		}
	})

	t.Run("NoListenLeftBehind", func(t *testing.T) {
		// Through PgBouncer's pool of one server connection, which every
		// statement of the forwarder shares.
		one := testenv.PgBouncer(t, testenv.PgBouncerOneURL())
		o := newPgbOutbox(t, direct, one, true)
		run := o.forward(t, pgxv5.WrapPool(one), forwarder.Config{})
		run.waitLost(t)
		run.stop(t)
		requireNoServerListening(t, testenv.PgBouncerOneURL(), o.d.NotifyChannel(), "after the forwarder stopped")

		// The listener alone, stopped while subscribed.
		ctx, cancel := context.WithCancel(testenv.Ctx(t, 30*time.Second))
		errc := make(chan error, 1)
		ready := make(chan struct{})
		go func() {
			errc <- pgxv5.WrapPool(one).Listen(ctx, o.d.NotifyChannel(), func() { close(ready) }, func() {})
		}()
		select {
		case <-ready:
		case err := <-errc:
			t.Fatalf("listen: %v", err)
		}
		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("listen: %v", err)
		}
		requireNoServerListening(t, testenv.PgBouncerOneURL(), o.d.NotifyChannel(), "after Listen returned")
	})
}

// TestPgBouncerLostNotificationsFallBack runs a forwarder whose listener
// subscribes for real but never hears a notification, as behind a proxy
// that drops them. Its poll interval is a minute and the forwarder only
// learns of new rows from the watch it falls back to, within milliseconds;
// without it, a message would wait for the poll or for the next attempt
// to listen, seconds apart (each waits the two-second probe out), so the
// bound of one second is that guarantee with a wide margin. Once
// notifications arrive again, it says so and they carry on.
func TestPgBouncerLostNotificationsFallBack(t *testing.T) {
	if os.Getenv(pgbChildEnv) != "" {
		t.Skip("producer process")
	}
	bouncer := testenv.PgBouncer(t, testenv.PgBouncerURL())
	direct := testenv.Postgres(t)
	o := newPgbOutbox(t, direct, bouncer, true)
	db := &deafDB{DB: pgxv5.WrapPool(bouncer, pgxv5.ListenOn(testenv.PostgresURL()))}
	db.deaf.Store(true)
	const bound = time.Second
	run := o.forward(t, db, forwarder.Config{DelayedPollInterval: time.Minute, Source: forwarder.Polling{PollInterval: time.Minute, NotifyProbeInterval: 100 * time.Millisecond}})
	run.waitLost(t)
	o.produce(t, 60, 5, 50*time.Millisecond) // spans more than one attempt to listen
	o.wait(t, 60)
	o.checkLatency(t, bound)

	db.deaf.Store(false)
	waitFor(t, 30*time.Second, "the forwarder to see notifications again", func() bool {
		return run.loggedInfo("notifications arrive again")
	})
	lost := run.lostCount()
	o.produce(t, 60, 5, 10*time.Millisecond)
	o.wait(t, 120)
	o.checkLatency(t, bound)
	run.stop(t)
	if run.lostCount() != lost {
		t.Fatalf("notifications reported lost after they arrived again: %v", run.errs())
	}
}

// TestPgBouncerCachedStatementsHint shows what pgx's default query exec
// mode meets behind PgBouncer in transaction pooling (1.18: no prepared
// statements across transactions), and that the error says what to set.
func TestPgBouncerCachedStatementsHint(t *testing.T) {
	if os.Getenv(pgbChildEnv) != "" {
		t.Skip("producer process")
	}
	_ = testenv.PgBouncer(t, testenv.PgBouncerOneURL())
	ctx := testenv.Ctx(t, 30*time.Second)
	url := strings.Replace(testenv.PgBouncerOneURL(), "default_query_exec_mode=exec", "default_query_exec_mode=cache_statement", 1)
	var dbs []*pgxv5.DB
	for range 2 {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		dbs = append(dbs, pgxv5.WrapPool(pool))
	}
	// Both clients share the one server connection: the second prepares
	// the statement the first left on it.
	q := `SELECT $1::int + ` + strconv.Itoa(int(time.Now().UnixNano()%1000000))
	var err error
	for _, db := range dbs {
		if _, err = db.Exec(ctx, q, 1); err != nil {
			break
		}
	}
	if err == nil {
		t.Fatal("cached prepared statements worked through PgBouncer in transaction pooling; the hint is untested")
	}
	if !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
		t.Fatalf("error without the hint: %v", err)
	}
}

// TestPgBouncerProducerChild is the producer process of the tests above;
// it does nothing unless started by them.
func TestPgBouncerProducerChild(t *testing.T) {
	spec := os.Getenv(pgbChildEnv)
	if spec == "" {
		t.Skip("run by TestPgBouncer")
	}
	f := strings.Split(spec, ",")
	schema, topic := f[0], f[1]
	first, _ := strconv.Atoi(f[2])
	n, _ := strconv.Atoi(f[3])
	keys, _ := strconv.Atoi(f[4])
	every, _ := time.ParseDuration(f[5])
	d := postgres.MustNew(postgres.Options{Schema: schema, Notify: f[6] == "1"})
	pool := testenv.PgBouncer(t, testenv.PgBouncerURL())
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Ctx(t, 5*time.Minute)
	for i := first; i < first+n; i++ {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte(`{"n":`+strconv.Itoa(i)+`}`))
		msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "k"+strconv.Itoa(i%keys))
		msg.Metadata.Set(pgbSeqField, strconv.Itoa(i))
		msg.Metadata.Set(pgbSentField, strconv.FormatInt(time.Now().UnixNano(), 10))
		if err := pub.PublishTx(ctx, pgxv5.WrapTx(tx), topic, msg); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(every)
	}
}

// pgbOutbox is an outbox in a fresh schema, migrated through PgBouncer,
// with a Kafka topic its messages go to.
type pgbOutbox struct {
	d      *postgres.Dialect
	notify bool
	topic  string
	kafka  *testenv.Kafka
	got    *testenv.KafkaCollector
	sent   int // messages produced so far
}

func newPgbOutbox(t *testing.T, direct, bouncer *pgxpool.Pool, notify bool) *pgbOutbox {
	t.Helper()
	topic := testenv.UniqueName("pgb_")
	k := testenv.StartKafka(t, topic)
	d := testenv.PostgresDialect(t, pgxv5.WrapPool(bouncer), direct, postgres.Options{Notify: notify})
	return &pgbOutbox{d: d, notify: notify, topic: topic, kafka: k, got: k.Collect(t, topic)}
}

// produce writes n messages over keys ordering keys from another process
// through PgBouncer, one transaction each, every apart, and waits for it.
// Their seq metadata numbers all messages of the outbox.
func (o *pgbOutbox) produce(t *testing.T, n, keys int, every time.Duration) {
	t.Helper()
	notify := "0"
	if o.notify {
		notify = "1"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPgBouncerProducerChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), pgbChildEnv+"="+strings.Join([]string{
		o.d.Schema(), o.topic, strconv.Itoa(o.sent), strconv.Itoa(n), strconv.Itoa(keys), every.String(), notify}, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("producer process: %v\n%s", err, out)
	}
	o.sent += n
}

// wait waits for n distinct messages and checks their per-key order.
func (o *pgbOutbox) wait(t *testing.T, n int) {
	t.Helper()
	if err := o.got.WaitN(testenv.Ctx(t, 2*time.Minute), n, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := o.got.CheckSeqOrder(pgbSeqField); err != nil {
		t.Fatal(err)
	}
}

// checkLatency fails when a message arrived more than bound after its
// producer stamped it (just before its commit).
func (o *pgbOutbox) checkLatency(t *testing.T, bound time.Duration) {
	t.Helper()
	var worst time.Duration
	for _, r := range o.got.FirstDeliveries() {
		sent, err := strconv.ParseInt(r.Metadata[pgbSentField], 10, 64)
		if err != nil {
			t.Fatalf("message %s without %s", r.UUID, pgbSentField)
		}
		worst = max(worst, r.Arrived.Sub(time.Unix(0, sent)))
	}
	t.Logf("slowest of %d messages: %v after its commit", o.got.Distinct(), worst)
	if worst > bound {
		t.Fatalf("a message took %v from commit to Kafka, more than %v", worst, bound)
	}
}

// pgbRun is a running forwarder and what it reported.
type pgbRun struct {
	f    *forwarder.Forwarder
	logs *logRecorder
	done chan error

	mu              sync.Mutex
	errors          []error
	lost            atomic.Int64
	lastStatusError string
}

func (o *pgbOutbox) forward(t *testing.T, db sqladapters.DB, cfg forwarder.Config) *pgbRun {
	t.Helper()
	r := &pgbRun{logs: &logRecorder{}, done: make(chan error, 1)}
	cfg.DB, cfg.Dialect, cfg.Destination, cfg.Logger = db, o.d, o.kafka.KeyedPublisher(t), r.logs
	cfg.Hooks.OnError = func(err error) {
		if errors.Is(err, forwarder.ErrNotificationsLost) {
			r.lost.Add(1)
		}
		r.mu.Lock()
		r.errors = append(r.errors, err)
		r.mu.Unlock()
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.f = f
	go func() { r.done <- f.Run(context.Background()) }()
	t.Cleanup(func() { _ = f.Close() })
	if err := f.Ready(testenv.Ctx(t, 30*time.Second)); err != nil {
		t.Fatalf("forwarder not ready: %v", err)
	}
	return r
}

func (r *pgbRun) stop(t *testing.T) {
	t.Helper()
	st, err := r.f.Status(testenv.Ctx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r.lastStatusError = st.LastError
	if err := r.f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-r.done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

func (r *pgbRun) waitLost(t *testing.T) {
	t.Helper()
	waitFor(t, 30*time.Second, "the forwarder to report lost notifications", func() bool { return r.lostCount() > 0 })
}

func (r *pgbRun) lostCount() int64 { return r.lost.Load() }

func (r *pgbRun) errs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.errors...)
}

func (r *pgbRun) loggedError(part string) bool {
	return strings.Contains(r.logs.text(watermill.ErrorLogLevel), part)
}

func (r *pgbRun) loggedInfo(part string) bool {
	return strings.Contains(r.logs.text(watermill.InfoLogLevel), part)
}

// logRecorder keeps the forwarder's log lines for the test to read while
// the forwarder goes on logging.
type logRecorder struct {
	mu    sync.Mutex
	lines map[watermill.LogLevel][]string
}

func (l *logRecorder) add(level watermill.LogLevel, msg string, err error) {
	if err != nil {
		msg += ": " + err.Error()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lines == nil {
		l.lines = map[watermill.LogLevel][]string{}
	}
	l.lines[level] = append(l.lines[level], msg)
}

// text returns the lines logged at level and above, one per line.
func (l *logRecorder) text(level watermill.LogLevel) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for lv := level; lv <= watermill.ErrorLogLevel; lv++ {
		for _, line := range l.lines[lv] {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func (l *logRecorder) Error(msg string, err error, _ watermill.LogFields) {
	l.add(watermill.ErrorLogLevel, msg, err)
}
func (l *logRecorder) Info(msg string, _ watermill.LogFields) {
	l.add(watermill.InfoLogLevel, msg, nil)
}
func (l *logRecorder) Debug(msg string, _ watermill.LogFields) {
	l.add(watermill.DebugLogLevel, msg, nil)
}
func (l *logRecorder) Trace(msg string, _ watermill.LogFields) {
	l.add(watermill.TraceLogLevel, msg, nil)
}
func (l *logRecorder) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// requireNoServerListening fails when a server connection of url's
// PgBouncer pool listens on channel.
func requireNoServerListening(t *testing.T, url, channel, when string) {
	t.Helper()
	servers, err := testenv.PgBouncerListening(testenv.Ctx(t, 30*time.Second), url)
	if err != nil {
		t.Fatal(err)
	}
	for pid, channels := range servers {
		if slices.Contains(channels, channel) {
			t.Fatalf("%s: PgBouncer's server connection %d (of %d) still listens on %s", when, pid, len(servers), channel)
		}
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deafDB listens for real but, while deaf, hears no notification.
type deafDB struct {
	*pgxv5.DB
	deaf atomic.Bool
}

func (d *deafDB) Listen(ctx context.Context, channel string, ready, notify func()) error {
	return d.DB.Listen(ctx, channel, ready, func() {
		if !d.deaf.Load() {
			notify()
		}
	})
}
