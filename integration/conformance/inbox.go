package conformance

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
)

// WaitTimeout guards waits for asynchronous inbox work against hangs; it
// is not a performance expectation.
const WaitTimeout = 30 * time.Second

// Inbox runs the inbox suite: Record's answers for first deliveries,
// duplicates, rolled-back and concurrent duplicates with every transaction
// source, exact keys, the inbox middleware on GoChannel routers with every
// InboxDBs handle, consume-process-produce through the context outbox
// publisher, the retention cleaner, and a missing inbox table.
//
// Where the database serializes writers (Features.ConcurrentWriters is
// false), a concurrent duplicate waits when it begins to write instead of
// on the inbox key; the guarantees are the same and so are the tests.
func Inbox(t *testing.T, env Env) {
	t.Run("Record", func(t *testing.T) {
		for _, src := range env.Sources {
			t.Run(src.Name, func(t *testing.T) { inboxRecordSuite(t, env, src) })
		}
		levels := env.IsolationLevels
		if len(levels) == 0 {
			levels = []sql.IsolationLevel{sql.LevelDefault}
		}
		for _, iso := range levels {
			t.Run("Racing/"+iso.String(), func(t *testing.T) { inboxRace(t, env, iso) })
		}
	})
	t.Run("Keys", func(t *testing.T) { inboxKeys(t, env) })
	dbs := env.InboxDBs
	if len(dbs) == 0 {
		dbs = []DBSource{{Name: "DB", DB: env.DB}}
	}
	for _, db := range dbs {
		t.Run("Middleware/"+db.Name, func(t *testing.T) { inboxMiddlewareSuite(t, env, db.DB) })
	}
	t.Run("ConsumeProcessProduce", func(t *testing.T) { inboxProduce(t, env) })
	t.Run("Cleaner", func(t *testing.T) { inboxCleanerSuite(t, env) })
	t.Run("MissingTable", func(t *testing.T) { inboxMissingTable(t, env) })
}

// ErrInjected is what test handlers return to fail a delivery on purpose.
var ErrInjected = errors.New("injected handler failure")

func newInbox(t testing.TB, d sqladapters.Dialect) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

// mustRecord records (consumer, id) in tx and fails unless Record answers
// want.
func mustRecord(t testing.TB, ctx context.Context, ib *inbox.Inbox, tx sqladapters.Tx, consumer, id string, want bool) {
	t.Helper()
	first, err := ib.Record(ctx, tx, consumer, id)
	if err != nil {
		t.Fatalf("record %.40q for %.40q: %v", id, consumer, err)
	}
	if first != want {
		t.Fatalf("record %.40q for %.40q: first = %v, want %v", id, consumer, first, want)
	}
}

type recordResult struct {
	first bool
	err   error
}

func inboxRecordSuite(t *testing.T, env Env, src TxSource) {
	ctx := context.Background()
	d := env.NewDialect(t)
	ib := newInbox(t, d)

	t.Run("FirstThenDuplicate", func(t *testing.T) {
		id := watermill.NewUUID()
		tx := src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		mustRecord(t, ctx, ib, tx, "billing", id, true)
		commit(t, ctx, tx)
		tx = src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		mustRecord(t, ctx, ib, tx, "billing", id, false)
		// The key is the pair: another consumer has not seen the message.
		mustRecord(t, ctx, ib, tx, "shipping", id, true)
	})

	t.Run("RollbackForgets", func(t *testing.T) {
		id := watermill.NewUUID()
		tx := src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		mustRecord(t, ctx, ib, tx, "billing", id, true)
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		tx = src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		mustRecord(t, ctx, ib, tx, "billing", id, true)
	})

	// A second transaction recording the same key waits for the first and
	// then follows its outcome.
	for _, outcome := range []string{"Commit", "Rollback"} {
		t.Run("ConcurrentThen"+outcome, func(t *testing.T) {
			if src.Sequential {
				t.Skip("source runs one transaction at a time")
			}
			id := watermill.NewUUID()
			a := src.MustBegin(t, ctx)
			defer sqladapters.Rollback(a)
			mustRecord(t, ctx, ib, a, "billing", id, true)
			done := make(chan recordResult, 1)
			started := make(chan struct{})
			go func() {
				close(started)
				done <- recordAlone(ctx, src, ib, "billing", id)
			}()
			<-started
			waitBlocked(t, ctx, env, d, 1, done)
			var err error
			if outcome == "Commit" {
				err = a.Commit(ctx)
			} else {
				err = a.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := receive(t, done)
			if r.err != nil {
				t.Fatal(r.err)
			}
			if want := outcome == "Rollback"; r.first != want {
				t.Fatalf("after the other transaction's %s, first = %v, want %v", strings.ToLower(outcome), r.first, want)
			}
		})
	}
}

// recordAlone records (consumer, id) in a transaction of its own and
// reports errors in the result, for goroutines other than the test's. It
// rolls back before it returns, so the key is free once the result arrives.
func recordAlone(ctx context.Context, src TxSource, ib *inbox.Inbox, consumer, id string) recordResult {
	tx, err := src.Begin(ctx)
	if err != nil {
		return recordResult{err: err}
	}
	defer sqladapters.Rollback(tx)
	first, err := ib.Record(ctx, tx, consumer, id)
	return recordResult{first, err}
}

// waitBlocked returns once n transactions wait on the inbox table of d.
// Without Env.InboxLockWaiters it pauses briefly. Either way it fails if a
// result arrives on done first: that transaction did not wait.
func waitBlocked[T any](t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect, n int, done <-chan T) {
	t.Helper()
	if env.InboxLockWaiters == nil {
		select {
		case r := <-done:
			t.Fatalf("a transaction did not wait for the one holding the key: %+v", r)
		case <-time.After(50 * time.Millisecond):
		}
		return
	}
	deadline := time.Now().Add(WaitTimeout)
	for {
		waiting, err := env.InboxLockWaiters(ctx, d)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		select {
		case r := <-done:
			t.Fatalf("a transaction did not wait for the one holding the key: %+v", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d transactions wait on the inbox key after %v", waiting, n, WaitTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func receive[T any](t testing.TB, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(WaitTimeout):
		t.Fatalf("no result after %v", WaitTimeout)
		panic("unreachable")
	}
}

// inboxRace races several transactions at isolation level iso to record
// one message: the first holds its key until all others wait on it (or
// briefly, where waits cannot be observed). Exactly one sees the message
// first, and no transaction fails.
func inboxRace(t *testing.T, env Env, iso sql.IsolationLevel) {
	ctx := context.Background()
	d := env.NewDialect(t)
	ib := newInbox(t, d)
	const racers = 6
	id := watermill.NewUUID()
	start := make(chan struct{})
	results := make(chan recordResult, racers)
	var wg sync.WaitGroup
	for range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := env.DB.Begin(ctx, sql.TxOptions{Isolation: iso})
			if err != nil {
				results <- recordResult{err: err}
				return
			}
			defer sqladapters.Rollback(tx)
			<-start
			first, err := ib.Record(ctx, tx, "billing", id)
			if err == nil && first {
				// The handler's work, while the others queue on the key.
				err = waitWaiters(ctx, env, d, racers-1)
			}
			if err == nil {
				err = tx.Commit(ctx)
			}
			results <- recordResult{first, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	firsts := 0
	for r := range results {
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.first {
			firsts++
		}
	}
	if firsts != 1 {
		t.Fatalf("%d of %d racing transactions saw the message first", firsts, racers)
	}
	tx, err := env.DB.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	mustRecord(t, ctx, ib, tx, "billing", id, false)
}

// waitWaiters is waitBlocked for goroutines other than the test's.
func waitWaiters(ctx context.Context, env Env, d sqladapters.Dialect, n int) error {
	if env.InboxLockWaiters == nil {
		time.Sleep(50 * time.Millisecond)
		return nil
	}
	deadline := time.Now().Add(WaitTimeout)
	for {
		waiting, err := env.InboxLockWaiters(ctx, d)
		if err != nil || waiting >= n {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d transactions wait on the inbox key after %v", waiting, n, WaitTimeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// inboxKeys checks that keys are stored byte for byte, whatever the
// database's collation or column width, and that keys Record rejects never
// reach the database.
func inboxKeys(t *testing.T, env Env) {
	ctx := context.Background()
	d := env.NewDialect(t)
	ib := newInbox(t, d)

	t.Run("Exact", func(t *testing.T) {
		long := strings.Repeat("m", inbox.MaxKeyBytes)
		keys := [][2]string{
			{"c", "abc"}, {"c", "ABC"}, {"C", "abc"}, {"c", "abc "}, {"c", "ábc"}, {"c", "abc\t"},
			{"ab", "c"}, {"a", "bc"}, // the pair is the key, not a concatenation
			{"c", long}, {"c", long[:inbox.MaxKeyBytes-1] + "n"}, {"c", long[:600]},
			{strings.Repeat("c", inbox.MaxKeyBytes), "abc"}, {"c", "żółć ✓"},
		}
		for _, want := range []bool{true, false} {
			func() {
				tx, err := env.DB.Begin(ctx, sql.TxOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer sqladapters.Rollback(tx) // on SQLite an open tx would block later tests
				for _, k := range keys {
					mustRecord(t, ctx, ib, tx, k[0], k[1], want)
				}
				commit(t, ctx, tx)
			}()
		}
	})

	t.Run("InvalidNeverReachTheDatabase", func(t *testing.T) {
		tx, err := env.DB.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sqladapters.Rollback(tx)
		for _, c := range []struct{ name, consumer, id, want string }{
			{"EmptyConsumer", "", "m1", "consumer is empty"},
			{"EmptyID", "billing", "", "message id is empty"},
			{"InvalidUTF8Consumer", "bill\xffing", "m1", "not valid UTF-8"},
			{"InvalidUTF8ID", "billing", "m\xc3", "not valid UTF-8"},
			{"NUL", "billing", "m\x001", "NUL"},
			{"TooLong", "billing", strings.Repeat("x", inbox.MaxKeyBytes+1), "longer than"},
		} {
			_, err := ib.Record(ctx, tx, c.consumer, c.id)
			if !errors.Is(err, inbox.ErrInvalidKey) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: want ErrInvalidKey saying %q, got %v", c.name, c.want, err)
			}
		}
		// No statement failed in tx (Postgres would have aborted it).
		mustRecord(t, ctx, ib, tx, "billing", "m1", true)
	})
}

// InboxFixture is one test's inbox: a migrated dialect, an effects table
// where handlers apply their business effect, and the handle the
// middleware begins transactions on. It counts what the middleware it
// makes reports, so a test can wait for deliveries and then check that
// every effect happened once.
type InboxFixture struct {
	// DB is the handle the middleware begins transactions on.
	DB sqladapters.DB
	// Dialect owns the test's inbox and outbox tables.
	Dialect sqladapters.Dialect
	// EffectsTable is where ApplyEffect writes, in the database's default
	// schema.
	EffectsTable string

	t   *testing.T
	ctx context.Context
	env Env

	handled atomic.Int64 // handler runs that committed (see MarkHandled)
	dups    atomic.Int64 // duplicates reported by OnDuplicate
}

// NewInboxFixture returns a fixture with a dialect and an effects table of
// its own, whose middleware begins transactions on db.
func NewInboxFixture(t *testing.T, env Env, db sqladapters.DB) *InboxFixture {
	t.Helper()
	d := env.NewDialect(t)
	// Each application of an effect is a row of its own, so a message
	// handled twice leaves two rows (and no unique violation that could
	// hide the second run).
	table := createTable(t, env, "effects_", `id VARCHAR(100) PRIMARY KEY, message_id VARCHAR(100) NOT NULL`)
	return AttachInboxFixture(t, env, db, d, table)
}

// AttachInboxFixture returns a fixture on the dialect and effects table of
// one that NewInboxFixture made, so that a process that the test starts
// applies its effects where the test looks for them.
func AttachInboxFixture(t *testing.T, env Env, db sqladapters.DB, d sqladapters.Dialect, effectsTable string) *InboxFixture {
	return &InboxFixture{DB: db, Dialect: d, EffectsTable: effectsTable, t: t, ctx: context.Background(), env: env}
}

// createTable creates a business table with a name unique to the test in
// the database's default schema, and drops it after the test.
func createTable(t testing.TB, env Env, prefix, columns string) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := env.DB.Exec(ctx, `CREATE TABLE `+name+` (`+columns+`)`); err != nil {
		t.Fatalf("create table %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := env.DB.Exec(context.Background(), `DROP TABLE IF EXISTS `+name); err != nil {
			t.Logf("drop table %s: %v", name, err)
		}
	})
	return name
}

// rebind rewrites the ? parameters of q into the database's placeholders.
func (env Env) rebind(q string) string {
	if env.Placeholder == nil {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString(env.Placeholder(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (env Env) timeArg(t time.Time) any {
	if env.TimeArg == nil {
		return t
	}
	return env.TimeArg(t)
}

// queryInt runs q (with ? parameters) on e and returns the integer it
// selects.
func (env Env) queryInt(ctx context.Context, e sqladapters.Executor, q string, args ...any) (int, error) {
	rows, err := e.Query(ctx, env.rebind(q), args...)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", q, err)
	}
	defer rows.Close()
	var n int
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: no row", q)
	}
	if err := rows.Scan(&n); err != nil {
		return 0, err
	}
	return n, rows.Err()
}

// ApplyEffect is the business write of a handler, in the transaction the
// inbox middleware put into ctx.
func (f *InboxFixture) ApplyEffect(ctx context.Context, messageID string) error {
	tx, err := sqladapters.TxFromContext(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, f.env.rebind(`INSERT INTO `+f.EffectsTable+` (id, message_id) VALUES (?, ?)`), watermill.NewUUID(), messageID)
	return err
}

// Effect returns how often the effect of messageID was committed.
func (f *InboxFixture) Effect(messageID string) int {
	f.t.Helper()
	n, err := f.CountEffect(messageID)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// CountEffect is Effect for handlers and other goroutines than the
// test's, which must not fail the test: it returns the error instead.
func (f *InboxFixture) CountEffect(messageID string) (int, error) {
	return f.env.queryInt(f.ctx, f.env.DB, `SELECT count(*) FROM `+f.EffectsTable+` WHERE message_id = ?`, messageID)
}

// Effects returns how often each message's effect was committed.
func (f *InboxFixture) Effects() map[string]int {
	f.t.Helper()
	rows, err := f.env.DB.Query(f.ctx, `SELECT message_id, count(*) FROM `+f.EffectsTable+` GROUP BY message_id`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			f.t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// InboxRows returns the committed inbox rows as "consumer|message_id",
// sorted.
func (f *InboxFixture) InboxRows() []string {
	f.t.Helper()
	rows, err := f.env.DB.Query(f.ctx, `SELECT consumer, message_id FROM `+f.Dialect.InboxTable()+` ORDER BY consumer, message_id`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var c, m string
		if err := rows.Scan(&c, &m); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, c+"|"+m)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// handledKey marks, in a delivered message's metadata, that the handler
// finished its work; the fixture's middleware counts the mark once the
// inbox has committed.
const handledKey = "x_inbox_conformance_handled"

// MarkHandled records that the handler succeeded for msg. The fixture
// counts it in Handled only once the transaction committed, so a test that
// waited for Handled sees the committed effects.
func MarkHandled(msg *message.Message) { msg.Metadata.Set(handledKey, "1") }

// Middleware returns the inbox middleware for consumer on the fixture's
// DB and dialect, counting duplicates and committed handler runs; edits
// adjust its config.
func (f *InboxFixture) Middleware(consumer string, edits ...func(*middleware.InboxConfig)) message.HandlerMiddleware {
	f.t.Helper()
	cfg := middleware.InboxConfig{
		DB:          f.DB,
		Dialect:     f.Dialect,
		Consumer:    consumer,
		OnDuplicate: func(*message.Message) { f.dups.Add(1) },
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	mw, err := middleware.NewInbox(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	return func(h message.HandlerFunc) message.HandlerFunc {
		inner := mw(h)
		return func(msg *message.Message) ([]*message.Message, error) {
			delete(msg.Metadata, handledKey)
			out, err := inner(msg)
			if err == nil && msg.Metadata.Get(handledKey) == "1" {
				f.handled.Add(1)
			}
			return out, err
		}
	}
}

// EffectHandler applies the effect of each message under its UUID.
func (f *InboxFixture) EffectHandler(msg *message.Message) error {
	if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
		return err
	}
	MarkHandled(msg)
	return nil
}

// Handled counts the handler runs that called MarkHandled and committed.
func (f *InboxFixture) Handled() int64 { return f.handled.Load() }

// Duplicates counts the deliveries the middleware skipped as duplicates.
func (f *InboxFixture) Duplicates() int64 { return f.dups.Load() }

// WaitDeliveries waits until committed handler runs plus duplicates
// reach n.
func (f *InboxFixture) WaitDeliveries(n int64) {
	f.t.Helper()
	WaitFor(f.t, fmt.Sprintf("%d deliveries (handled + duplicates)", n), func() bool {
		return f.Handled()+f.Duplicates() >= n
	})
}

// WaitFor polls cond until it holds, failing the test after WaitTimeout.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// NewGoChannel returns a GoChannel closed after the test (after routers
// started later, whose cleanups run first).
func NewGoChannel(t testing.TB, persistent bool) *gochannel.GoChannel {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: persistent}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	return gc
}

// PublishCopies publishes n copies of msg, as a broker that redelivers it
// would hand them out.
func PublishCopies(t testing.TB, pub message.Publisher, topic string, msg *message.Message, n int) {
	t.Helper()
	for range n {
		if err := pub.Publish(topic, msg.Copy()); err != nil {
			t.Fatal(err)
		}
	}
}

// StartRouter builds a router, lets configure add handlers and
// middleware, and returns it running. Cleanup closes it and waits for Run
// to return, so a test may also close it early.
func StartRouter(t testing.TB, configure func(r *message.Router)) *message.Router {
	t.Helper()
	r, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	configure(r)
	errc := make(chan error, 1)
	go func() { errc <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		_ = r.Close()
		if err := <-errc; err != nil {
			t.Errorf("router: %v", err)
		}
	})
	select {
	case <-r.Running():
	case err := <-errc:
		errc <- err
		t.Fatalf("router stopped at start: %v", err)
	case <-time.After(WaitTimeout):
		t.Fatal("router did not start")
	}
	return r
}

func inboxMiddlewareSuite(t *testing.T, env Env, db sqladapters.DB) {
	t.Run("DeliveredThreeTimes", func(t *testing.T) {
		f := NewInboxFixture(t, env, db)
		gc := NewGoChannel(t, true)
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		PublishCopies(t, gc, "orders", msg, 3)
		StartRouter(t, func(r *message.Router) {
			r.AddMiddleware(f.Middleware("billing"))
			r.AddConsumerHandler("apply", "orders", gc, f.EffectHandler)
		})
		f.WaitDeliveries(3)
		if h, d := f.Handled(), f.Duplicates(); h != 1 || d != 2 {
			t.Fatalf("handled %d, duplicates %d; want 1 and 2", h, d)
		}
		if n := f.Effect(msg.UUID); n != 1 {
			t.Fatalf("effect applied %d times", n)
		}
		// The consumer is scoped to the router handler.
		if rows := f.InboxRows(); len(rows) != 1 || rows[0] != "billing/apply|"+msg.UUID {
			t.Fatalf("inbox rows %v", rows)
		}
	})

	t.Run("FailedAttemptLeavesNothing", func(t *testing.T) {
		f := NewInboxFixture(t, env, db)
		gc := NewGoChannel(t, true)
		var mu sync.Mutex
		attempts := 0
		leftovers := -1 // rows the failed attempt left committed, seen by the second
		handler := func(msg *message.Message) error {
			mu.Lock()
			attempts++
			n := attempts
			mu.Unlock()
			if n == 2 {
				e, err := env.queryInt(f.ctx, env.DB, `SELECT count(*) FROM `+f.EffectsTable)
				if err != nil {
					return err
				}
				i, err := env.queryInt(f.ctx, env.DB, `SELECT count(*) FROM `+f.Dialect.InboxTable())
				if err != nil {
					return err
				}
				mu.Lock()
				leftovers = e + i
				mu.Unlock()
			}
			if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
				return err
			}
			if n == 1 {
				return ErrInjected // nacked: GoChannel delivers it again
			}
			MarkHandled(msg)
			return nil
		}
		msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
		PublishCopies(t, gc, "orders", msg, 1)
		StartRouter(t, func(r *message.Router) {
			r.AddMiddleware(f.Middleware("billing"))
			r.AddConsumerHandler("apply", "orders", gc, handler)
		})
		f.WaitDeliveries(1)
		mu.Lock()
		defer mu.Unlock()
		if leftovers != 0 {
			t.Fatalf("the failed attempt left %d rows (business + inbox)", leftovers)
		}
		if n := f.Effect(msg.UUID); n != 1 || attempts != 2 {
			t.Fatalf("effect %d after %d attempts; want 1 after 2", n, attempts)
		}
		if rows := f.InboxRows(); len(rows) != 1 {
			t.Fatalf("inbox rows %v", rows)
		}
	})

	// Two routers with the same consumer and handler names get every
	// message at the same time (GoChannel gives each subscriber each
	// message): each effect happens once and no delivery fails.
	t.Run("ConcurrentDuplicatesTwoRouters", func(t *testing.T) {
		f := NewInboxFixture(t, env, db)
		gc := NewGoChannel(t, false)
		var mu sync.Mutex
		arrived := map[string]int{}
		var failures []string
		observe := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				mu.Lock()
				arrived[msg.UUID]++
				mu.Unlock()
				out, err := h(msg)
				if err != nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("%s: %v", msg.UUID, err))
					mu.Unlock()
				}
				return out, err
			}
		}
		handler := func(msg *message.Message) error {
			if msg.Metadata.Get("barrier") == "1" {
				// Hold this delivery's transaction until the other
				// router's delivery of the message waits on it.
				deadline := time.Now().Add(WaitTimeout)
				for {
					mu.Lock()
					both := arrived[msg.UUID] == 2
					mu.Unlock()
					if both {
						break
					}
					if time.Now().After(deadline) {
						return errors.New("the other router never received the barrier message")
					}
					time.Sleep(2 * time.Millisecond)
				}
				if err := waitWaiters(f.ctx, env, f.Dialect, 1); err != nil {
					return err
				}
			}
			return f.EffectHandler(msg)
		}
		for range 2 {
			StartRouter(t, func(r *message.Router) {
				r.AddMiddleware(observe, f.Middleware("billing"))
				r.AddConsumerHandler("apply", "orders", gc, handler)
			})
		}
		barrier := message.NewMessage(watermill.NewUUID(), nil)
		barrier.Metadata.Set("barrier", "1")
		PublishCopies(t, gc, "orders", barrier, 1)
		f.WaitDeliveries(2)
		mu.Lock()
		if len(failures) != 0 {
			t.Fatalf("deliveries failed: %v", failures)
		}
		mu.Unlock()
		const n = 50
		for range n {
			PublishCopies(t, gc, "orders", message.NewMessage(watermill.NewUUID(), nil), 1)
		}
		f.WaitDeliveries(2 * (n + 1))
		mu.Lock()
		defer mu.Unlock()
		if len(failures) != 0 {
			t.Fatalf("deliveries failed: %v", failures)
		}
		if h, d := f.Handled(), f.Duplicates(); h != n+1 || d != n+1 {
			t.Fatalf("handled %d, duplicates %d; want %d each", h, d, n+1)
		}
		effects := f.Effects()
		for id, c := range effects {
			if c != 1 {
				t.Fatalf("effect of %s applied %d times", id, c)
			}
		}
		if len(effects) != n+1 || len(f.InboxRows()) != n+1 {
			t.Fatalf("%d effects and %d inbox rows, want %d each", len(effects), len(f.InboxRows()), n+1)
		}
	})
}

// inboxProduce: a handler under the inbox writes a row and publishes a
// follow-up event through the long-lived context outbox publisher. Both
// commit with the inbox row, or neither does.
func inboxProduce(t *testing.T, env Env) {
	f := NewInboxFixture(t, env, env.DB)
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: f.Dialect})
	if err != nil {
		t.Fatal(err)
	}
	attempts := 0
	h := f.Middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
		attempts++
		if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
			return nil, err
		}
		ev := message.NewMessage("invoice-"+msg.UUID, []byte(`{"invoice":1}`))
		ev.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7")
		ev.SetContext(msg.Context()) // carries the inbox transaction
		if err := outbox.Publish("invoices", ev); err != nil {
			return nil, err
		}
		if attempts == 1 {
			return nil, ErrInjected
		}
		return nil, nil
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))

	if _, err := h(msg.Copy()); !errors.Is(err, ErrInjected) {
		t.Fatalf("first attempt: want the handler's error, got %v", err)
	}
	if n, pending, rows := f.Effect(msg.UUID), ReadPending(t, f.ctx, env.DB, f.Dialect), f.InboxRows(); n != 0 || len(pending) != 0 || len(rows) != 0 {
		t.Fatalf("failed attempt left effect %d, %d outbox rows and inbox rows %v", n, len(pending), rows)
	}

	if _, err := h(msg.Copy()); err != nil {
		t.Fatalf("redelivery: %v", err)
	}
	pending := ReadPending(t, f.ctx, env.DB, f.Dialect)
	if len(pending) != 1 {
		t.Fatalf("%d outbox rows after success, want 1", len(pending))
	}
	if r := pending[0]; r.Topic != "invoices" || r.UUID != "invoice-"+msg.UUID || string(r.Payload) != `{"invoice":1}` || r.Key != "customer-7" {
		t.Fatalf("outbox row %+v", r)
	}
	if n := f.Effect(msg.UUID); n != 1 {
		t.Fatalf("effect %d", n)
	}
	if rows := f.InboxRows(); len(rows) != 1 || rows[0] != "billing|"+msg.UUID {
		t.Fatalf("inbox rows %v", rows)
	}

	// A duplicate neither runs the handler nor produces again.
	if _, err := h(msg.Copy()); err != nil {
		t.Fatal(err)
	}
	if n := len(ReadPending(t, f.ctx, env.DB, f.Dialect)); n != 1 || attempts != 2 || f.Duplicates() != 1 {
		t.Fatalf("after a duplicate: %d outbox rows, %d attempts, %d duplicates", n, attempts, f.Duplicates())
	}
}

// countingDB counts the statements run through Exec or Query (a range
// delete of the inbox runs through Query).
type countingDB struct {
	sqladapters.DB
	execs atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	c.execs.Add(1)
	return c.DB.Exec(ctx, q, args...)
}

func (c *countingDB) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	c.execs.Add(1)
	return c.DB.Query(ctx, q, args...)
}

func inboxCleanerSuite(t *testing.T, env Env) {
	ctx := context.Background()
	// record stores n messages prefix1..prefixn through Record, then, for
	// age > 0, moves their received_at age into the past.
	record := func(t *testing.T, d sqladapters.Dialect, prefix string, n int, age time.Duration) {
		t.Helper()
		ib := newInbox(t, d)
		tx, err := env.DB.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sqladapters.Rollback(tx)
		for i := range n {
			mustRecord(t, ctx, ib, tx, "billing", prefix+strconv.Itoa(i+1), true)
		}
		if age > 0 {
			q := env.rebind(`UPDATE ` + d.InboxTable() + ` SET received_at = ? WHERE message_id LIKE ?`)
			if _, err := tx.Exec(ctx, q, env.timeArg(time.Now().Add(-age)), prefix+"%"); err != nil {
				t.Fatal(err)
			}
		}
		commit(t, ctx, tx)
	}
	count := func(t *testing.T, d sqladapters.Dialect, prefix string) int {
		t.Helper()
		n, err := env.queryInt(ctx, env.DB, `SELECT count(*) FROM `+d.InboxTable()+` WHERE message_id LIKE ?`, prefix+"%")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	t.Run("CleanOnceInBatches", func(t *testing.T) {
		d := env.NewDialect(t)
		record(t, d, "old-", 25, 2*time.Hour)
		record(t, d, "recent-", 5, 30*time.Minute)
		record(t, d, "fresh-", 5, 0)
		db := &countingDB{DB: env.DB}
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: db, Dialect: d, Retention: time.Hour, BatchSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := c.CleanOnce(ctx); err != nil || n != 25 {
			t.Fatalf("deleted %d, %v; want the 25 old rows", n, err)
		}
		if n := db.execs.Load(); n != 3 {
			t.Fatalf("ran %d delete statements, want 3 batches of at most 10", n)
		}
		if got := count(t, d, "old-"); got != 0 {
			t.Fatalf("%d old rows left", got)
		}
		if got := count(t, d, "recent-") + count(t, d, "fresh-"); got != 10 {
			t.Fatalf("%d rows within the retention window left, want 10", got)
		}
		if n, err := c.CleanOnce(ctx); err != nil || n != 0 {
			t.Fatalf("second CleanOnce deleted %d, %v", n, err)
		}
		// The shortest retention: rows Record wrote a moment ago stay.
		c, err = inbox.NewCleaner(inbox.CleanerConfig{DB: env.DB, Dialect: d, Retention: inbox.MinRetention})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := c.CleanOnce(ctx); err != nil || n != 5 {
			t.Fatalf("with MinRetention deleted %d, %v; want the 5 recent rows", n, err)
		}
		if got := count(t, d, "fresh-"); got != 5 {
			t.Fatalf("%d fresh rows left, want 5", got)
		}
	})

	t.Run("RunAndClose", func(t *testing.T) {
		d := env.NewDialect(t)
		record(t, d, "old-", 30, 15*24*time.Hour)
		record(t, d, "recent-", 3, 24*time.Hour)
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: env.DB, Dialect: d, BatchSize: 7, Interval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- c.Run(context.Background()) }()
		<-c.Running()
		if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrRunning) {
			t.Fatalf("second Run: want ErrRunning, got %v", err)
		}
		// Run cleans at start; DefaultRetention (14 days) keeps the 1-day rows.
		WaitFor(t, "the first cleaning round", func() bool { return count(t, d, "old-") == 0 })
		if got := count(t, d, "recent-"); got != 3 {
			t.Fatalf("%d recent rows left, want 3", got)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := receive(t, errc); err != nil {
			t.Fatalf("Run returned %v after Close", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrClosed) {
			t.Fatalf("Run after Close: want ErrClosed, got %v", err)
		}
	})

	t.Run("RunEndsWithContext", func(t *testing.T) {
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: env.DB, Dialect: env.NewDialect(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		<-c.Running()
		cancel()
		if err := receive(t, errc); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

// inboxMissingTable: Record, the middleware and the cleaner fail with an
// error that wraps ErrMissingTable, names the table and says how to create
// it; the handler never runs.
func inboxMissingTable(t *testing.T, env Env) {
	if env.NewUnmigratedDialect == nil {
		t.Skip("no unmigrated dialect")
	}
	ctx := context.Background()
	d := env.NewUnmigratedDialect(t)
	table := d.InboxTable()
	if i := strings.LastIndex(table, "."); i >= 0 {
		table = table[i+1:]
	}
	table = strings.Trim(table, "`\"")
	check := func(t *testing.T, what string, err error) {
		t.Helper()
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) {
			t.Fatalf("%s: want a *MissingTableError, got %v", what, err)
		}
		if !strings.Contains(err.Error(), "sqladapters.Migrate") || !strings.Contains(err.Error(), table) {
			t.Fatalf("%s: error does not name table %s and say how to migrate: %v", what, table, err)
		}
	}

	t.Run("Record", func(t *testing.T) {
		tx, err := env.DB.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sqladapters.Rollback(tx)
		_, err = newInbox(t, d).Record(ctx, tx, "billing", "m1")
		check(t, "Record", err)
	})

	t.Run("Middleware", func(t *testing.T) {
		mw, err := middleware.NewInbox(middleware.InboxConfig{DB: env.DB, Dialect: d, Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		_, err = mw(func(*message.Message) ([]*message.Message, error) {
			ran = true
			return nil, nil
		})(message.NewMessage(watermill.NewUUID(), nil))
		check(t, "middleware", err)
		if ran {
			t.Fatal("handler ran without an inbox table")
		}
	})

	t.Run("Cleaner", func(t *testing.T) {
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: env.DB, Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CleanOnce(ctx)
		check(t, "CleanOnce", err)
	})
}
