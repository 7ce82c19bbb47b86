package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// inboxWaitTimeout guards waits for asynchronous deliveries against hangs;
// it is not a performance expectation.
const inboxWaitTimeout = 30 * time.Second

// inboxFixture is one test's database: a migrated schema of its own with an
// effects table where handlers apply their business effect.
type inboxFixture struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	db     sqladapters.DB // the DB the middleware begins transactions on
	driver string         // "pgx" or "database-sql": how handlers reach the tx
	sqlDB  *sql.DB        // with "database-sql"
	d      *postgres.Dialect

	handled atomic.Int64 // handler runs that committed (see markHandled)
	dups    atomic.Int64 // duplicates reported by OnDuplicate
}

func newInboxFixture(t *testing.T) *inboxFixture {
	t.Helper()
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	f := &inboxFixture{
		t:      t,
		ctx:    testenv.Ctx(t, 2*time.Minute),
		pool:   pool,
		db:     db,
		driver: "pgx",
		d:      testenv.PostgresDialect(t, db, pool, postgres.Options{}),
	}
	f.exec(`CREATE TABLE ` + f.table("effects") + ` (id text PRIMARY KEY, n int NOT NULL)`)
	return f
}

// useStdSQL makes the middleware begin transactions through database/sql
// (pgx stdlib), and handlers reach them with stdsql.TxFromContext.
func (f *inboxFixture) useStdSQL() {
	f.sqlDB = openSQL(f.t, "pgx", testenv.PostgresURL())
	f.db = stdsql.WrapDB(f.sqlDB)
	f.driver = "database-sql"
}

// newInboxFixtureFor returns a fixture whose middleware uses driver.
func newInboxFixtureFor(t *testing.T, driver string) *inboxFixture {
	t.Helper()
	f := newInboxFixture(t)
	if driver == "database-sql" {
		f.useStdSQL()
	}
	return f
}

// inboxDrivers are the DB adapters the middleware tests run with.
var inboxDrivers = []string{"pgx", "database-sql"}

// connsInUse counts the middleware DB's connections held by a transaction
// or statement.
func (f *inboxFixture) connsInUse() int {
	if f.sqlDB != nil {
		return f.sqlDB.Stats().InUse
	}
	return int(f.pool.Stat().AcquiredConns())
}

func (f *inboxFixture) table(name string) string {
	return `"` + f.d.Schema() + `"."` + name + `"`
}

func (f *inboxFixture) exec(q string, args ...any) {
	f.t.Helper()
	if _, err := f.pool.Exec(f.ctx, q, args...); err != nil {
		f.t.Fatalf("%s: %v", q, err)
	}
}

// applyEffect is the business write of a handler: it counts one more
// application of key in the transaction the inbox middleware put into ctx.
// A message handled twice would leave n = 2.
func (f *inboxFixture) applyEffect(ctx context.Context, key string) error {
	q := `INSERT INTO ` + f.table("effects") + ` (id, n) VALUES ($1, 1) ON CONFLICT (id) DO UPDATE SET n = effects.n + 1`
	switch f.driver {
	case "pgx":
		tx, err := pgxv5.TxFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, q, key)
		return err
	default:
		tx, err := stdsql.TxFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, q, key)
		return err
	}
}

// effect returns how often key's effect was applied, as committed.
func (f *inboxFixture) effect(key string) int {
	f.t.Helper()
	var n int
	err := f.pool.QueryRow(f.ctx, `SELECT coalesce(max(n), 0) FROM `+f.table("effects")+` WHERE id = $1`, key).Scan(&n)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// effects returns every committed effect.
func (f *inboxFixture) effects() map[string]int {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT id, n FROM `+f.table("effects"))
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

// inboxRows returns the committed inbox rows as "consumer|message_id".
func (f *inboxFixture) inboxRows() []string {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `SELECT consumer || '|' || message_id FROM `+f.d.InboxTable()+` ORDER BY 1`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// handledKey marks, in a delivered message's metadata, that the handler
// finished its work; the fixture's middleware counts the mark once the
// inbox has committed.
const handledKey = "x_inbox_test_handled"

// markHandled records that the handler succeeded for msg. It counts in
// f.handled only once the transaction committed, so a test that waited for
// f.handled sees the committed effects.
func markHandled(msg *message.Message) { msg.Metadata.Set(handledKey, "1") }

// middleware returns the inbox middleware for consumer with the fixture's
// DB and dialect, counting duplicates and committed handler runs; edit
// adjusts the config.
func (f *inboxFixture) middleware(consumer string, edit ...func(*middleware.InboxConfig)) message.HandlerMiddleware {
	f.t.Helper()
	cfg := middleware.InboxConfig{
		DB:          f.db,
		Dialect:     f.d,
		Consumer:    consumer,
		OnDuplicate: func(*message.Message) { f.dups.Add(1) },
		Logger:      watermill.NopLogger{},
	}
	for _, e := range edit {
		e(&cfg)
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

// effectHandler applies the effect of each message under its UUID.
func (f *inboxFixture) effectHandler(msg *message.Message) error {
	if err := f.applyEffect(msg.Context(), msg.UUID); err != nil {
		return err
	}
	markHandled(msg)
	return nil
}

// waitDeliveries waits until handled runs plus duplicates reach n.
func (f *inboxFixture) waitDeliveries(n int64) {
	f.t.Helper()
	inboxWait(f.t, fmt.Sprintf("%d deliveries (handled+duplicates)", n), func() bool {
		return f.handled.Load()+f.dups.Load() >= n
	})
}

// inboxWait polls cond until it holds, failing the test after
// inboxWaitTimeout.
func inboxWait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(inboxWaitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startInboxRouter builds a router, lets configure add handlers and
// middleware, runs it and waits until it runs. Cleanup closes it and waits
// for Run to return.
func startInboxRouter(t *testing.T, configure func(r *message.Router)) *message.Router {
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
	case <-time.After(inboxWaitTimeout):
		t.Fatal("router did not start")
	}
	return r
}

// failer decides per message UUID and attempt number (from 1) what a
// handler does; it records the attempts.
type failer struct {
	mu       sync.Mutex
	attempts map[string]int
}

func newFailer() *failer { return &failer{attempts: map[string]int{}} }

// next counts an attempt of uuid and returns its number.
func (fl *failer) next(uuid string) int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.attempts[uuid]++
	return fl.attempts[uuid]
}

func (fl *failer) count(uuid string) int {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.attempts[uuid]
}

var errInjected = errors.New("injected handler failure")
