package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"

	"github.com/millbox/millbox/forwarder"
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

func msg(uuid, key string, hash int32) sqladapters.OutboxMessage {
	return sqladapters.OutboxMessage{Topic: "t", UUID: uuid, Payload: []byte(uuid), Metadata: []byte(`{}`), Key: key, KeyHash: hash}
}

func wantIDs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func TestSQLiteForwarderDialect(t *testing.T) {
	t.Run("PendingOrderPartitionsExclusion", func(t *testing.T) {
		f := newLiteFixture(t)
		var msgs []sqladapters.OutboxMessage
		for i := range 6 {
			msgs = append(msgs, msg(fmt.Sprint("m", i), "", int32(i)))
		}
		ids := f.insert(msgs...)
		wantIDs(t, "all", f.pendingIDs(sqladapters.PendingQuery{}), ids)
		wantIDs(t, "partitions 1 and 3 of 4", f.pendingIDs(sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}}), []int64{ids[1], ids[3], ids[5]})
		wantIDs(t, "no partition", f.pendingIDs(sqladapters.PendingQuery{Partitions: 4, Owned: []int{}}), nil)
		wantIDs(t, "excluded", f.pendingIDs(sqladapters.PendingQuery{Exclude: []int64{ids[0], ids[2]}}), []int64{ids[1], ids[3], ids[4], ids[5]})
		wantIDs(t, "limit", f.pendingIDs(sqladapters.PendingQuery{Limit: 2}), ids[:2])
	})

	// The backoff check runs once per row read, so it must be an index
	// search, not a scan; and with most rows dead the rows must come from
	// the pending index in id order, not from a walk over the dead ones.
	t.Run("PendingPlanUsesIndexes", func(t *testing.T) {
		f := newLiteFixture(t)
		msgs := make([]sqladapters.OutboxMessage, 3000)
		for i := range msgs {
			msgs[i] = msg(fmt.Sprint("m", i), fmt.Sprint("k", i%3), int32(i%3))
		}
		f.insert(msgs...)
		if _, err := f.sql.ExecContext(f.ctx, `UPDATE `+f.d.OutboxTable()+` SET dead_at = '2026-01-01T00:00:00.000Z' WHERE id <= 2900`); err != nil {
			t.Fatal(err)
		}
		if _, err := f.sql.ExecContext(f.ctx, `ANALYZE`); err != nil {
			t.Fatal(err)
		}
		for _, q := range []sqladapters.PendingQuery{
			{Limit: 2000},
			{Partitions: 16, Owned: []int{0, 1, 2}, Exclude: []int64{1, 2, 3}, Limit: 2000},
		} {
			sel := f.d.SelectPending(q)
			rows, err := f.sql.QueryContext(f.ctx, "EXPLAIN QUERY PLAN "+sel.SQL, sel.Args...)
			if err != nil {
				t.Fatal(err)
			}
			var steps []string
			for rows.Next() {
				var id, parent, notused int
				var detail string
				if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
					t.Fatal(err)
				}
				steps = append(steps, detail)
			}
			rows.Close()
			plan := strings.Join(steps, "\n")
			if !strings.Contains(plan, "_pending_idx") || !strings.Contains(plan, "_retry_idx") {
				t.Fatalf("plan does not read through the pending and retry indexes:\n%s\n%s", plan, sel.SQL)
			}
			for _, s := range steps {
				if s == "SCAN o" || strings.HasPrefix(s, "SCAN p") || strings.Contains(s, "USE TEMP B-TREE") {
					t.Fatalf("plan step %q scans the outbox or sorts:\n%s", s, plan)
				}
			}
		}
	})

	t.Run("ChunkedInsertKeepsOrder", func(t *testing.T) {
		f := newLiteFixture(t)
		msgs := make([]sqladapters.OutboxMessage, 12001)
		for i := range msgs {
			msgs[i] = msg(fmt.Sprintf("m%05d", i), fmt.Sprint("k", i%7), int32(i))
		}
		tx, err := f.db.Begin(f.ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range f.d.InsertOutbox(msgs) {
			if _, err := q.Exec(f.ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		rows := conformance.ReadPending(t, f.ctx, f.db, f.d)
		if len(rows) != len(msgs) {
			t.Fatalf("%d rows, want %d", len(rows), len(msgs))
		}
		for i, r := range rows {
			if r.UUID != msgs[i].UUID || (i > 0 && r.ID <= rows[i-1].ID) {
				t.Fatalf("row %d is %s id %d", i, r.UUID, r.ID)
			}
		}
	})

	t.Run("BackoffBlocksOnlyItsKey", func(t *testing.T) {
		f := newLiteFixture(t)
		ids := f.insert(msg("a", "k", 1), msg("b", "k", 1), msg("c", "j", 2), msg("d", "", 3))
		a, b, c, d := ids[0], ids[1], ids[2], ids[3]
		f.exec(f.d.RecordFailure(sqladapters.Failure{ID: a, Attempts: 1, Error: "e1", Backoff: time.Hour}))
		wantIDs(t, "a backing off", f.pendingIDs(sqladapters.PendingQuery{}), []int64{c, d})
		f.exec(f.d.RecordFailure(sqladapters.Failure{ID: a, Attempts: 2, Error: "e2", Backoff: 0}))
		wantIDs(t, "a due again", f.pendingIDs(sqladapters.PendingQuery{}), []int64{a, b, c, d})
		f.exec(f.d.RecordFailure(sqladapters.Failure{ID: b, Attempts: 1, Error: "e", Backoff: time.Hour}))
		wantIDs(t, "a later row backing off blocks nothing before it", f.pendingIDs(sqladapters.PendingQuery{}), []int64{a, c, d})
	})

	t.Run("DeadLettersAndRequeue", func(t *testing.T) {
		f := newLiteFixture(t)
		start := time.Now().Add(-time.Second)
		ids := f.insert(msg("a", "k", 1), msg("b", "k", 1), msg("c", "", 2))
		a, b, c := ids[0], ids[1], ids[2]
		f.exec(f.d.RecordFailure(sqladapters.Failure{ID: a, Attempts: 3, Error: "boom \xff\x00", Backoff: time.Hour, Dead: true}))
		wantIDs(t, "a dead does not block its key", f.pendingIDs(sqladapters.PendingQuery{}), []int64{b, c})
		// The forwarder's own reader: times scan into time.Time through
		// the declared TIMESTAMP type.
		dead, err := forwarder.DeadLetters(f.ctx, f.db, f.d, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) != 1 || dead[0].ID != a || dead[0].UUID != "a" || dead[0].Key != "k" || dead[0].Attempts != 3 || dead[0].LastError != "boom \xff\x00" {
			t.Fatalf("dead letters %+v", dead)
		}
		if dl := dead[0]; dl.CreatedAt.Before(start) || dl.DeadAt.Before(dl.CreatedAt) || time.Since(dl.DeadAt) > time.Minute || dl.CreatedAt.Location() != time.UTC {
			t.Fatalf("created %v dead %v", dl.CreatedAt, dl.DeadAt)
		}
		f.exec(f.d.RecordFailure(sqladapters.Failure{ID: c, Attempts: 1, Error: "x", Dead: true}))
		if page, err := forwarder.DeadLetters(f.ctx, f.db, f.d, a, 10); err != nil || len(page) != 1 || page[0].ID != c {
			t.Fatalf("page after %d: %+v, %v", a, page, err)
		}
		if n := f.exec(f.d.RequeueDeadLetters([]int64{})); n != 0 {
			t.Fatalf("empty requeue touched %d rows", n)
		}
		if n := f.exec(f.d.RequeueDeadLetters([]int64{a, b})); n != 1 {
			t.Fatalf("requeue a (b is not dead): %d rows", n)
		}
		rows := conformance.ReadPending(t, f.ctx, f.db, f.d)
		if len(rows) != 2 || rows[0].ID != a || rows[0].Attempts != 0 {
			t.Fatalf("after requeue: %+v", rows)
		}
		if n := f.exec(f.d.RequeueDeadLetters(nil)); n != 1 {
			t.Fatalf("requeue all: %d rows", n)
		}
		wantIDs(t, "everything pending", f.pendingIDs(sqladapters.PendingQuery{}), ids)
	})

	t.Run("CompleteDeletesOrKeepsAndIDsNeverRepeat", func(t *testing.T) {
		f := newLiteFixture(t)
		ids := f.insert(msg("a", "", 1), msg("b", "", 2), msg("c", "", 3))
		if n := f.exec(f.d.CompleteForwarded(ids[:2], false)); n != 2 {
			t.Fatalf("deleted %d", n)
		}
		if n := f.exec(f.d.CompleteForwarded(ids[2:], true)); n != 1 {
			t.Fatalf("kept %d", n)
		}
		wantIDs(t, "nothing pending", f.pendingIDs(sqladapters.PendingQuery{}), nil)
		if n := f.count(f.d.OutboxTable(), "published_at IS NOT NULL"); n != 1 {
			t.Fatalf("%d kept rows", n)
		}
		f.exec(f.d.CompleteForwarded(ids[2:], false))
		// The table is empty; a new row still gets a new id.
		next := f.insert(msg("d", "", 4))
		if next[0] <= ids[2] {
			t.Fatalf("id %d reused after deleting up to %d", next[0], ids[2])
		}
	})

	t.Run("Leases", func(t *testing.T) {
		f := newLiteFixture(t)
		for range 2 {
			for _, q := range f.d.EnsurePartitions(4) {
				f.exec(q)
			}
		}
		for _, q := range f.d.EnsurePartitions(0) {
			f.exec(q)
		}
		if n := f.ints(f.d.CountPartitions()); n[0] != 4 {
			t.Fatalf("%d partitions", n[0])
		}

		f.exec(f.d.Heartbeat("a", time.Minute))
		f.exec(f.d.Heartbeat("b", time.Minute))
		f.exec(f.d.Heartbeat("a", time.Minute))
		f.exec(f.d.Heartbeat("gone", -time.Second))
		if n := f.ints(f.d.CountMembers()); n[0] != 2 {
			t.Fatalf("%d live members, want 2", n[0])
		}
		if n := f.exec(f.d.RemoveMember("a")); n != 2 {
			t.Fatalf("removed %d members, want a and the expired one", n)
		}
		f.exec(f.d.Heartbeat("a", time.Minute))

		owned := func(inst string) []int64 { return f.ints(f.d.OwnedPartitions(inst)) }
		if n := f.exec(f.d.ClaimPartitions("a", time.Minute, 2)); n != 2 {
			t.Fatalf("a claimed %d", n)
		}
		if n := f.exec(f.d.ClaimPartitions("b", time.Minute, 4)); n != 2 {
			t.Fatalf("b claimed %d of the 2 left", n)
		}
		wantIDs(t, "a owns", owned("a"), []int64{0, 1})
		wantIDs(t, "b owns", owned("b"), []int64{2, 3})
		if n := f.exec(f.d.ClaimPartitions("a", time.Minute, 1)); n != 0 {
			t.Fatalf("a claimed %d taken partitions", n)
		}
		if n := f.exec(f.d.ReleasePartitions("b", []int{0, 1})); n != 0 {
			t.Fatalf("b released %d partitions of a", n)
		}
		if n := f.exec(f.d.ReleasePartitions("a", []int{1})); n != 1 {
			t.Fatalf("a released %d", n)
		}
		f.exec(f.d.ClaimPartitions("b", time.Minute, 1))
		wantIDs(t, "b after a released 1", owned("b"), []int64{1, 2, 3})
		if n := f.exec(f.d.RenewPartitions("a", time.Minute)); n != 1 {
			t.Fatalf("a renewed %d", n)
		}
		// Leases of b run out (renewed into the past); expired leases are
		// neither owned nor renewable, and a takes them over.
		f.exec(f.d.RenewPartitions("b", -time.Second))
		wantIDs(t, "b after expiry", owned("b"), nil)
		if n := f.exec(f.d.RenewPartitions("b", time.Minute)); n != 0 {
			t.Fatalf("b renewed %d expired leases", n)
		}
		if n := f.exec(f.d.ClaimPartitions("a", time.Minute, 4)); n != 3 {
			t.Fatalf("a claimed %d expired partitions, want 3", n)
		}
		wantIDs(t, "a owns all", owned("a"), []int64{0, 1, 2, 3})
		// A short lease ends on the database clock.
		f.exec(f.d.ReleasePartitions("a", []int{0, 1, 2, 3}))
		f.exec(f.d.ClaimPartitions("a", 30*time.Millisecond, 4))
		wantIDs(t, "a short lease", owned("a"), []int64{0, 1, 2, 3})
		time.Sleep(60 * time.Millisecond)
		wantIDs(t, "a after the short lease", owned("a"), nil)
	})

	t.Run("ConcurrentClaimsNeverOverlap", func(t *testing.T) {
		f := newLiteFixture(t)
		const parts, instances = 32, 8
		for _, q := range f.d.EnsurePartitions(parts) {
			f.exec(q)
		}
		var wg sync.WaitGroup
		claimed := make([]int64, instances)
		errs := make([]error, instances)
		for i := range instances {
			wg.Add(1)
			go func() {
				defer wg.Done()
				db := f.db
				if i%2 == 1 {
					db = stdsql.WrapDB(f.deferred)
				}
				// Each asks for more than its share, racing the others.
				for range 3 {
					n, err := f.d.ClaimPartitions(fmt.Sprint("i", i), time.Minute, parts/2).Exec(f.ctx, db)
					if err != nil {
						errs[i] = err
						return
					}
					claimed[i] += n
				}
			}()
		}
		wg.Wait()
		var total int64
		for i := range instances {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			total += claimed[i]
			if got := int64(len(f.ints(f.d.OwnedPartitions(fmt.Sprint("i", i))))); got != claimed[i] {
				t.Fatalf("instance %d claimed %d but owns %d", i, claimed[i], got)
			}
		}
		if total != parts {
			t.Fatalf("claims add up to %d of %d partitions", total, parts)
		}
	})
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
	_, err = missing.RecordFailure(sqladapters.Failure{ID: 1}).Exec(f.ctx, f.db)
	var mt *sqladapters.MissingTableError
	if !errors.As(missing.ClassifyError(err), &mt) || !strings.Contains(mt.Error(), "sqladapters.Migrate") {
		t.Fatalf("missing table: %v", err)
	}
}

// liteV2 adds a second migration that fails if it runs twice.
type liteV2 struct {
	*sqlite.Dialect
	extra string
}

func (d liteV2) Migrations() []sqladapters.Migration {
	return append(d.Dialect.Migrations(), sqladapters.Migration{
		Version: 2, Name: "extra", Statements: []string{`CREATE TABLE "` + d.extra + `" (id INTEGER)`},
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
		// An upgrade: every migrator reads version 1 applied, one applies
		// version 2, the others wait and find it applied.
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
		if n != 2 {
			t.Fatalf("%d versions recorded, want 2", n)
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
