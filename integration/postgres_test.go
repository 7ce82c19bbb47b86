package integration_test

import (
	"context"
	"database/sql"
	"strconv"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// pgDialectEnv is the Postgres environment without transaction sources
// and inbox handles: what the inbox fixture needs, for the price of a pool.
func pgDialectEnv(pool *pgxpool.Pool) conformance.Env {
	db := pgxv5.WrapPool(pool)
	return conformance.Env{
		DB: db,
		NewDialect: func(t *testing.T) sqladapters.Dialect {
			return testenv.PostgresDialect(t, db, pool, postgres.Options{})
		},
		Placeholder: func(n int) string { return "$" + strconv.Itoa(n) },
	}
}

// pgEnv builds the Postgres conformance environment with every way an
// application may hold a transaction.
func pgEnv(t *testing.T) conformance.Env {
	pool := testenv.Postgres(t)
	env := pgDialectEnv(pool)
	db := env.DB
	stdPgx := openSQL(t, "pgx", testenv.PostgresURL())
	libpq := openSQL(t, "postgres", testenv.PostgresURL())
	env.NewUnmigratedDialect = func(t *testing.T) sqladapters.Dialect {
		return postgres.MustNew(postgres.Options{OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_")})
	}
	env.InboxDBs = []conformance.DBSource{
		{Name: "pgxpool", DB: db},
		{Name: "database-sql-pgx-stdlib", DB: stdsql.WrapDB(stdPgx)},
	}
	env.InboxLockWaiters = func(ctx context.Context, d sqladapters.Dialect) (int, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
			"INSERT INTO "+d.InboxTable()+"%").Scan(&n)
		return n, err
	}
	env.Sources = []conformance.TxSource{
		{Name: "pgx.Conn", Begin: beginOnOwnConn},
		{Name: "pgxpool", Begin: beginOn(db)},
		{Name: "database-sql-pgx-stdlib", Begin: stdBegin(stdPgx)},
		{Name: "database-sql-lib-pq", Begin: stdBegin(libpq)},
		{Name: "watermill-sql-TxFromPgx", Begin: func(ctx context.Context) (sqladapters.Tx, error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				return nil, err
			}
			return wmsql.WrapTx(wsql.TxFromPgx(tx)), nil
		}},
		{Name: "watermill-sql-TxFromStdSQL", Begin: wmStdBegin(stdPgx)},
		{Name: "watermill-sql-BeginnerFromPgx", Begin: beginOn(wmsql.WrapBeginner(wsql.BeginnerFromPgx(pool)))},
		{Name: "watermill-sql-BeginnerFromStdSQL", Begin: beginOn(wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(libpq)))},
	}
	return env
}

// beginOn begins transactions the way an application holding db does.
func beginOn(db sqladapters.DB) func(ctx context.Context) (sqladapters.Tx, error) {
	return func(ctx context.Context) (sqladapters.Tx, error) { return db.Begin(ctx, sql.TxOptions{}) }
}

// stdBegin wraps the *sql.Tx an application began itself.
func stdBegin(db *sql.DB) func(ctx context.Context) (sqladapters.Tx, error) {
	return func(ctx context.Context) (sqladapters.Tx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return stdsql.WrapTx(tx), nil
	}
}

// wmStdBegin hands watermill-sql the *sql.Tx an application began itself.
func wmStdBegin(db *sql.DB) func(ctx context.Context) (sqladapters.Tx, error) {
	return func(ctx context.Context) (sqladapters.Tx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		return wmsql.WrapTx(wsql.TxFromStdSQL(tx)), nil
	}
}

// beginOnOwnConn begins on a pgx.Conn opened for the transaction alone, as
// an application without a pool does.
func beginOnOwnConn(ctx context.Context) (sqladapters.Tx, error) {
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return connTx{Tx: pgxv5.WrapTx(tx), conn: conn}, nil
}

// connTx closes its connection when it ends: its callers may run in any
// goroutine and have no test to register the close on.
type connTx struct {
	*pgxv5.Tx
	conn *pgx.Conn
}

func (c connTx) Commit(ctx context.Context) error {
	defer c.close()
	return c.Tx.Commit(ctx)
}

func (c connTx) Rollback(ctx context.Context) error {
	defer c.close()
	return c.Tx.Rollback(ctx)
}

func (c connTx) close() { _ = c.conn.Close(context.Background()) }

func openSQL(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(20)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, driver+" "+dsn, err)
	}
	return db
}

func TestPostgresOutboxConformance(t *testing.T) {
	conformance.Outbox(t, pgEnv(t))
}

func TestPostgresMigrations(t *testing.T) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	ctx := testenv.Ctx(t, time.Minute)

	t.Run("FreshRerunAndPrintedSQL", func(t *testing.T) {
		d := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool)})
		migrateTwice(t, ctx, db, d)
		// The printed script, applied by another tool to another schema,
		// creates the same tables and columns.
		other := testenv.PostgresSchema(t, pool)
		d2 := postgres.MustNew(postgres.Options{Schema: other})
		if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+other+`"`); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, sqladapters.MigrationSQL(d2)); err != nil {
			t.Fatalf("printed SQL does not apply: %v", err)
		}
		if a, b := pgColumns(t, ctx, pool, d.Schema()), pgColumns(t, ctx, pool, other); a != b {
			t.Fatalf("printed SQL made other columns:\n%s\nvs Migrate:\n%s", b, a)
		}
	})

	t.Run("ConcurrentMigrators", func(t *testing.T) {
		d := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool)})
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = sqladapters.Migrate(ctx, db, d)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM "`+d.Schema()+`"."millbox_outbox_migrations"`).Scan(&n); err != nil || n != len(d.Migrations()) {
			t.Fatalf("versions recorded: %d, %v", n, err)
		}
	})

	t.Run("InsideCallerTx", func(t *testing.T) {
		d := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool)})
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := sqladapters.MigrateTx(ctx, tx, d); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		var exists bool
		if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, d.Schema()+".millbox_outbox").Scan(&exists); err != nil || exists {
			t.Fatalf("rolled back migration left the outbox table (exists=%v, err=%v)", exists, err)
		}
	})
}

func pgColumns(t *testing.T, ctx context.Context, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	var s string
	err := pool.QueryRow(ctx, `SELECT string_agg(table_name || '.' || column_name || ':' || data_type || ':' || is_nullable, E'\n' ORDER BY table_name, ordinal_position)
FROM information_schema.columns WHERE table_schema = $1 AND table_name NOT LIKE '%_migrations'`, schema).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// recordingDB records the statements run through it and its transactions.
// migrateTwice migrates a fresh installation of d and checks that Migrate
// ran every statement Migrations lists, and that a second run applies none.
func migrateTwice(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect) {
	t.Helper()
	var applied []string
	for _, m := range d.Migrations() {
		applied = append(applied, m.Statements...)
	}
	rec := &recordingDB{DB: db}
	if err := sqladapters.Migrate(ctx, rec, d); err != nil {
		t.Fatal(err)
	}
	if got := rec.statementsIn(applied); len(got) != len(applied) {
		t.Fatalf("Migrate ran %d of the %d printed statements", len(got), len(applied))
	}
	rec = &recordingDB{DB: db}
	if err := sqladapters.Migrate(ctx, rec, d); err != nil {
		t.Fatal(err)
	}
	if got := rec.statementsIn(applied); len(got) != 0 {
		t.Fatalf("re-run applied %d schema statements", len(got))
	}
}

type recordingDB struct {
	sqladapters.DB
	mu    sync.Mutex
	stmts []string
}

func (r *recordingDB) record(q string) {
	r.mu.Lock()
	r.stmts = append(r.stmts, q)
	r.mu.Unlock()
}

func (r *recordingDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	r.record(q)
	return r.DB.Exec(ctx, q, args...)
}

func (r *recordingDB) Begin(ctx context.Context, o sql.TxOptions) (sqladapters.Tx, error) {
	tx, err := r.DB.Begin(ctx, o)
	if err != nil {
		return nil, err
	}
	return &recordingTx{Tx: tx, r: r}, nil
}

func (r *recordingDB) statementsIn(set []string) []string {
	want := map[string]bool{}
	for _, s := range set {
		want[s] = true
	}
	var out []string
	for _, s := range r.stmts {
		if want[s] {
			out = append(out, s)
		}
	}
	return out
}

type recordingTx struct {
	sqladapters.Tx
	r *recordingDB
}

func (t *recordingTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	t.r.record(q)
	return t.Tx.Exec(ctx, q, args...)
}

func TestPostgresForwarderConformance(t *testing.T) {
	conformance.Forwarder(t, pgEnv(t))
}

// The forwarder suite again with the forwarder's DB on database/sql and
// lib/pq, as applications without pgx run it.
func TestPostgresForwarderConformanceLibPQ(t *testing.T) {
	env := pgEnv(t)
	env.DB = stdsql.WrapDB(openSQL(t, "postgres", testenv.PostgresURL()))
	conformance.Forwarder(t, env)
}

func TestPostgresInboxConformance(t *testing.T) {
	conformance.Inbox(t, pgEnv(t))
}
