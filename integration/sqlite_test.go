package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// sqliteDeferred opens path the way an application that only sets a busy
// timeout does: transactions begin DEFERRED and take the write lock at
// their first write. The dialect must work with it too.
func sqliteDeferred(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open(modernc.DriverName, "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// sqliteEnv builds the SQLite conformance environment: one database file,
// tables unique to each test, and the ways an application holds a
// transaction on it.
func sqliteEnv(t *testing.T) conformance.Env {
	path := testenv.SQLitePath(t)
	db := testenv.SQLite(t, path)
	deferred := sqliteDeferred(t, path)
	wrapped := stdsql.WrapDB(db)
	return conformance.Env{
		DB: wrapped,
		NewDialect: func(t *testing.T) sqladapters.Dialect {
			return testenv.SQLiteDialect(t, wrapped, sqlite.Options{})
		},
		NewUnmigratedDialect: func(t *testing.T) sqladapters.Dialect {
			return sqlite.MustNew(sqlite.Options{OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_")})
		},
		TimeArg: func(t time.Time) any { return t.UTC().Format(sqlite.TimeLayout) },
		InboxDBs: []conformance.DBSource{
			{Name: "database-sql-modernc", DB: wrapped},
			{Name: "database-sql-modernc-deferred", DB: stdsql.WrapDB(deferred)},
		},
		Sources: []conformance.TxSource{
			{Name: "database-sql-modernc", Begin: stdBegin(db)},
			{Name: "database-sql-modernc-deferred", Begin: stdBegin(deferred)},
			{Name: "watermill-sql-TxFromStdSQL", Begin: wmStdBegin(db)},
			{Name: "watermill-sql-BeginnerFromStdSQL", Begin: beginOn(wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(db)))},
		},
	}
}

func TestSQLiteOutboxConformance(t *testing.T) {
	conformance.Outbox(t, sqliteEnv(t))
}

func TestSQLiteForwarderConformance(t *testing.T) {
	conformance.Forwarder(t, sqliteEnv(t))
}

func TestSQLiteInboxConformance(t *testing.T) {
	conformance.Inbox(t, sqliteEnv(t))
}

// liteFixture is one database file with a migrated dialect on it, opened
// through both pools.
type liteFixture struct {
	dialectOps
	path     string
	sql      *sql.DB // BEGIN IMMEDIATE
	deferred *sql.DB // BEGIN DEFERRED
}

func newLiteFixture(t *testing.T) *liteFixture {
	f := &liteFixture{dialectOps: dialectOps{t: t, ctx: testenv.Ctx(t, time.Minute)}, path: testenv.SQLitePath(t)}
	f.sql = testenv.SQLite(t, f.path)
	f.deferred = sqliteDeferred(t, f.path)
	f.db = stdsql.WrapDB(f.sql)
	f.d = testenv.SQLiteDialect(t, f.db, sqlite.Options{})
	return f
}

func (f *liteFixture) count(table, where string) int64 {
	f.t.Helper()
	return f.ints(sqladapters.Query{SQL: `SELECT count(*) FROM ` + table + ` WHERE ` + where})[0]
}

// TestSQLiteClassifyDriverErrors checks the mapping of SQLite's error
// codes: primary-key and unique violations are duplicates, NULLs never
// collide, and a missing table says how to migrate.
func TestSQLiteClassifyDriverErrors(t *testing.T) {
	f := newLiteFixture(t)
	raw := sqladapters.Query{SQL: `INSERT INTO ` + f.d.InboxTable() + ` (consumer, message_id) VALUES ('c', 'm')`}
	f.exec(raw)
	_, err := raw.Exec(f.ctx, f.db)
	if err == nil || !errors.Is(f.d.ClassifyError(err), sqladapters.ErrDuplicate) {
		t.Fatalf("primary key violation: %v", err)
	}
	f.exec(sqladapters.Query{SQL: `CREATE TABLE u (x TEXT UNIQUE)`})
	f.exec(sqladapters.Query{SQL: `INSERT INTO u VALUES ('a')`})
	_, err = sqladapters.Query{SQL: `INSERT INTO u VALUES ('a')`}.Exec(f.ctx, f.db)
	if err == nil || !errors.Is(f.d.ClassifyError(err), sqladapters.ErrDuplicate) {
		t.Fatalf("unique violation: %v", err)
	}
	_, err = sqladapters.Query{SQL: `INSERT INTO u VALUES (NULL), (NULL)`}.Exec(f.ctx, f.db)
	if err != nil {
		t.Fatal(err)
	}
	missing := sqlite.MustNew(sqlite.Options{OutboxTable: testenv.UniqueName("nothere_")})
	_, err = missing.RecordFailure(f.ctx, f.db, sqladapters.Failure{ID: 1})
	var mt *sqladapters.MissingTableError
	if !errors.As(err, &mt) || !strings.Contains(mt.Error(), "sqladapters.Migrate") {
		t.Fatalf("missing table: %v", err)
	}
}

// liteV2 adds a migration after the last one that fails if it runs twice.
type liteV2 struct {
	*sqlite.Dialect
	extra string
}

func (d liteV2) Migrations() []sqladapters.Migration {
	ms := d.Dialect.Migrations()
	return append(ms, sqladapters.Migration{
		Version: ms[len(ms)-1].Version + 1, Name: "extra", Statements: []string{`CREATE TABLE "` + d.extra + `" (id INTEGER)`},
	})
}

func liteSchema(t *testing.T, ctx context.Context, db *sql.DB) string {
	t.Helper()
	rows, err := db.QueryContext(ctx, `SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema
WHERE name NOT LIKE '%_migrations' AND name NOT LIKE 'sqlite_autoindex_%_migrations_%' ORDER BY type, name`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var typ, name, tbl, s string
		if err := rows.Scan(&typ, &name, &tbl, &s); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %s on %s: %s\n", typ, name, tbl, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestSQLiteMigrations(t *testing.T) {
	ctx := testenv.Ctx(t, time.Minute)

	t.Run("FreshRerunAndPrintedSQL", func(t *testing.T) {
		db := testenv.SQLite(t, testenv.SQLitePath(t))
		d := sqlite.MustNew(sqlite.Options{})
		migrateTwice(t, ctx, stdsql.WrapDB(db), d)
		// The printed script, applied by another tool to another file,
		// creates the same schema.
		other := testenv.SQLite(t, testenv.SQLitePath(t))
		if _, err := other.ExecContext(ctx, sqladapters.MigrationSQL(d)); err != nil {
			t.Fatalf("printed SQL does not apply: %v", err)
		}
		if a, b := liteSchema(t, ctx, db), liteSchema(t, ctx, other); a != b {
			t.Fatalf("printed SQL made another schema:\n%s\nvs Migrate:\n%s", b, a)
		}
		if s := liteSchema(t, ctx, db); strings.Contains(s, "migration_lock") {
			t.Fatalf("the migration lock table was committed:\n%s", s)
		}
	})

	t.Run("ConcurrentMigrators", func(t *testing.T) {
		path := testenv.SQLitePath(t)
		pools := []sqladapters.DB{stdsql.WrapDB(testenv.SQLite(t, path)), stdsql.WrapDB(sqliteDeferred(t, path))}
		d := sqlite.MustNew(sqlite.Options{})
		run := func(d sqladapters.Dialect) {
			t.Helper()
			var wg sync.WaitGroup
			errs := make([]error, 6)
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = sqladapters.Migrate(ctx, pools[i%2], d)
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		run(d)
		// An upgrade: every migrator reads the versions applied, one
		// applies the extra one, the others wait and find it applied.
		run(liteV2{Dialect: d, extra: "extra_v2"})
		versions, err := pools[0].Query(ctx, `SELECT count(*) FROM "millbox_outbox_migrations"`)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		for versions.Next() {
			_ = versions.Scan(&n)
		}
		versions.Close()
		if want := len(d.Migrations()) + 1; n != want {
			t.Fatalf("%d versions recorded, want %d", n, want)
		}
	})

	t.Run("InsideCallerTx", func(t *testing.T) {
		db := testenv.SQLite(t, testenv.SQLitePath(t))
		d := sqlite.MustNew(sqlite.Options{})
		for _, end := range []string{"rollback", "commit"} {
			tx, err := stdsql.WrapDB(db).Begin(ctx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS app_orders (id INTEGER PRIMARY KEY)`); err != nil {
				t.Fatal(err)
			}
			if err := sqladapters.MigrateTx(ctx, tx, d); err != nil {
				t.Fatal(err)
			}
			if end == "rollback" {
				err = tx.Rollback(ctx)
			} else {
				err = tx.Commit(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			var tables int
			if err := db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('app_orders', 'millbox_outbox', 'millbox_inbox')`).Scan(&tables); err != nil {
				t.Fatal(err)
			}
			if want := map[string]int{"rollback": 0, "commit": 3}[end]; tables != want {
				t.Fatalf("after %s: %d tables, want %d", end, tables, want)
			}
		}
	})
}
