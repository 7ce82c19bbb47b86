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

// pgEnv builds the Postgres conformance environment with every way an
// application may hold a transaction.
func pgEnv(t *testing.T) conformance.Env {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	stdPgx := openSQL(t, "pgx", testenv.PostgresURL())
	libpq := openSQL(t, "postgres", testenv.PostgresURL())
	return conformance.Env{
		DB: db,
		NewDialect: func(t *testing.T) sqladapters.Dialect {
			return testenv.PostgresDialect(t, db, pool, postgres.Options{})
		},
		NewUnmigratedDialect: func(t *testing.T) sqladapters.Dialect {
			return postgres.MustNew(postgres.Options{OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_")})
		},
		Placeholder: func(n int) string { return "$" + strconv.Itoa(n) },
		InboxDBs: []conformance.DBSource{
			{Name: "pgxpool", DB: db},
			{Name: "database-sql-pgx-stdlib", DB: stdsql.WrapDB(stdPgx)},
		},
		InboxLockWaiters: func(ctx context.Context, d sqladapters.Dialect) (int, error) {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
				"INSERT INTO "+d.InboxTable()+"%").Scan(&n)
			return n, err
		},
		Sources: []conformance.TxSource{
			{Name: "pgx.Conn", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				conn, err := pgx.Connect(ctx, testenv.PostgresURL())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { conn.Close(context.Background()) })
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return pgxv5.WrapTx(tx)
			}},
			{Name: "pgxpool", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return pgxv5.WrapTx(tx)
			}},
			{Name: "database-sql-pgx-stdlib", Begin: stdBegin(stdPgx)},
			{Name: "database-sql-lib-pq", Begin: stdBegin(libpq)},
			{Name: "watermill-sql-TxFromPgx", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return wmsql.WrapTx(wsql.TxFromPgx(tx))
			}},
			{Name: "watermill-sql-TxFromStdSQL", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				tx, err := stdPgx.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				return wmsql.WrapTx(wsql.TxFromStdSQL(tx))
			}},
			{Name: "watermill-sql-BeginnerFromPgx", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				tx, err := wmsql.WrapBeginner(wsql.BeginnerFromPgx(pool)).Begin(ctx, sql.TxOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return tx
			}},
			{Name: "watermill-sql-BeginnerFromStdSQL", Begin: func(t *testing.T, ctx context.Context) sqladapters.Tx {
				tx, err := wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(libpq)).Begin(ctx, sql.TxOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return tx
			}},
		},
	}
}

func stdBegin(db *sql.DB) func(t *testing.T, ctx context.Context) sqladapters.Tx {
	return func(t *testing.T, ctx context.Context) sqladapters.Tx {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return stdsql.WrapTx(tx)
	}
}

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
		rec := &recordingDB{DB: db}
		if err := sqladapters.Migrate(ctx, rec, d); err != nil {
			t.Fatal(err)
		}
		var applied []string
		for _, m := range d.Migrations() {
			applied = append(applied, m.Statements...)
		}
		if got := rec.statementsIn(applied); len(got) != len(applied) {
			t.Fatalf("Migrate ran %d of the %d printed statements", len(got), len(applied))
		}
		// A re-run applies nothing.
		rec2 := &recordingDB{DB: db}
		if err := sqladapters.Migrate(ctx, rec2, d); err != nil {
			t.Fatal(err)
		}
		if got := rec2.statementsIn(applied); len(got) != 0 {
			t.Fatalf("re-run applied %d schema statements", len(got))
		}
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

func TestPostgresInboxConformance(t *testing.T) {
	conformance.Inbox(t, pgEnv(t))
}
