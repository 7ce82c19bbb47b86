package integration_test

import (
	"database/sql"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// pgInbox is an inbox fixture on Postgres. Its pool is its own, so that
// tests can count the connections the middleware holds and run pgx
// statements beside it.
type pgInbox struct {
	*conformance.InboxFixture
	pool  *pgxpool.Pool
	sqlDB *sql.DB // the middleware's handle with "database-sql", else nil
}

// inboxDrivers are the DB adapters the middleware tests run with.
var inboxDrivers = []string{"pgx", "database-sql"}

func newInboxFixture(t *testing.T) *pgInbox {
	t.Helper()
	return newInboxFixtureFor(t, "pgx")
}

// newInboxFixtureFor returns a fixture whose middleware begins transactions
// through driver: "pgx" on the pool, or "database-sql" on pgx stdlib, where
// handlers reach them with stdsql.TxFromContext.
func newInboxFixtureFor(t *testing.T, driver string) *pgInbox {
	t.Helper()
	f := &pgInbox{pool: testenv.Postgres(t)}
	env := pgDialectEnv(f.pool)
	db := env.DB
	if driver == "database-sql" {
		f.sqlDB = openSQL(t, "pgx", testenv.PostgresURL())
		db = stdsql.WrapDB(f.sqlDB)
	}
	f.InboxFixture = conformance.NewInboxFixture(t, env, db)
	return f
}

// connsInUse counts the middleware DB's connections held by a transaction
// or statement.
func (f *pgInbox) connsInUse() int {
	if f.sqlDB != nil {
		return f.sqlDB.Stats().InUse
	}
	return int(f.pool.Stat().AcquiredConns())
}

// schema holds the fixture's inbox and outbox tables.
func (f *pgInbox) schema() string { return f.Dialect.(*postgres.Dialect).Schema() }

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
