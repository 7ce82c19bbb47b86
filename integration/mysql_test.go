package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// myEnv builds the MariaDB/MySQL conformance environment. db runs the
// forwarder and the assertions; the sources cover both protocols of
// go-sql-driver/mysql and watermill-sql's wrappers.
func myEnv(t *testing.T, db *sql.DB, opts mysql.Options) conformance.Env {
	prepared := testenv.MySQL(t)
	interpolated := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.InterpolateParams = true }))
	return conformance.Env{
		DB: stdsql.WrapDB(db),
		NewDialect: func(t *testing.T) sqladapters.Dialect {
			return testenv.MySQLDialect(t, db, opts)
		},
		NewUnmigratedDialect: func(t *testing.T) sqladapters.Dialect {
			return mysql.MustNew(mysql.Options{OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_")})
		},
		// Times go as UTC text, so the DSN's loc cannot shift them.
		TimeArg: func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") },
		InboxDBs: []conformance.DBSource{
			{Name: "database-sql", DB: stdsql.WrapDB(prepared)},
			{Name: "database-sql-interpolateParams", DB: stdsql.WrapDB(interpolated)},
		},
		IsolationLevels: []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted},
		// innodb_trx would tell lock waits apart, but InnoDB refreshes it
		// only once nobody has read it for 0.1s, so polling it sees
		// nothing new. The process list is live; the session holding the
		// key has finished its insert, so any session still running the
		// inbox insert waits on it.
		InboxLockWaiters: func(ctx context.Context, d sqladapters.Dialect) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist WHERE command IN ('Query', 'Execute') AND info LIKE ?`,
				"INSERT IGNORE INTO "+d.InboxTable()+"%").Scan(&n)
			return n, err
		},
		Sources: []conformance.TxSource{
			{Name: "database-sql", Begin: stdBegin(prepared)},
			{Name: "database-sql-interpolateParams", Begin: stdBegin(interpolated)},
			{Name: "watermill-sql-TxFromStdSQL", Begin: wmStdBegin(prepared)},
			{Name: "watermill-sql-BeginnerFromStdSQL", Begin: beginOn(wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(interpolated)))},
		},
	}
}

func TestMySQLOutboxConformance(t *testing.T) {
	conformance.Outbox(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
}

func TestMySQLInboxConformance(t *testing.T) {
	conformance.Inbox(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
}

// TestMySQLForwarderConformance runs the forwarder suite twice: with the
// default protocol and plain claims, and with interpolateParams (the
// recommended DSN) and SKIP LOCKED claims when the server has them.
func TestMySQLForwarderConformance(t *testing.T) {
	t.Run("prepared", func(t *testing.T) {
		conformance.Forwarder(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
	})
	t.Run("interpolateParams", func(t *testing.T) {
		db := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.InterpolateParams = true }))
		skip, err := mysql.DetectSkipLocked(context.Background(), stdsql.WrapDB(db))
		if err != nil {
			t.Fatal(err)
		}
		conformance.Forwarder(t, myEnv(t, db, mysql.Options{SkipLocked: skip}))
	})
}

// TestMySQLDetectMaxAllowedPacket reads the server's max_allowed_packet
// into a dialect whose message limit then fits it.
func TestMySQLDetectMaxAllowedPacket(t *testing.T) {
	raw := testenv.MySQL(t)
	ctx := testenv.Ctx(t, time.Minute)
	n, err := mysql.DetectMaxAllowedPacket(ctx, stdsql.WrapDB(raw))
	if err != nil {
		t.Fatal(err)
	}
	var want int
	if err := raw.QueryRowContext(ctx, `SELECT @@global.max_allowed_packet`).Scan(&want); err != nil || n != want {
		t.Fatalf("detected %d, server has %d (%v)", n, want, err)
	}
	d, err := mysql.New(mysql.Options{MaxAllowedPacket: n})
	if err != nil {
		t.Fatal(err)
	}
	if m := d.MaxMessageBytes(); m <= 0 || 2*m >= n {
		t.Fatalf("MaxMessageBytes %d for max_allowed_packet %d", m, n)
	}
}

func TestMySQLMigrations(t *testing.T) {
	raw := testenv.MySQL(t)
	db := stdsql.WrapDB(raw)
	ctx := testenv.Ctx(t, 2*time.Minute)

	t.Run("FreshRerunAndPrintedSQL", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		migrateTwice(t, ctx, db, d)
		// The printed script, run by another tool (here one multi-statement
		// call), creates the same columns and indexes.
		d2 := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		multi := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.MultiStatements = true }))
		if _, err := multi.ExecContext(ctx, sqladapters.MigrationSQL(d2)); err != nil {
			t.Fatalf("printed SQL does not apply: %v", err)
		}
		a, b := myShape(t, ctx, raw, d), myShape(t, ctx, raw, d2)
		if a != b {
			t.Fatalf("printed SQL made another schema:\n%s\nvs Migrate:\n%s", b, a)
		}
		for _, want := range []string{"payload:longblob", "metadata:longtext", "created_at:datetime(6)", "index state_idx", "index retry_idx", "index received_idx", "index PRIMARY:consumer,message_id"} {
			if !strings.Contains(a, want) {
				t.Fatalf("schema lacks %q:\n%s", want, a)
			}
		}
	})

	t.Run("ConcurrentMigrators", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
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
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+d.Tables()[4]).Scan(&n); err != nil || n != len(d.Migrations()) {
			t.Fatalf("versions recorded: %d, %v", n, err)
		}
	})

	t.Run("MigrateTxRefused", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		own := testenv.UniqueName("app_")
		if _, err := raw.ExecContext(ctx, "CREATE TABLE `"+own+"` (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Exec("DROP TABLE IF EXISTS `" + own + "`") })
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO `"+own+"` (id) VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		err = sqladapters.MigrateTx(ctx, tx, d)
		if err == nil || !strings.Contains(err.Error(), "commits DDL implicitly") {
			t.Fatalf("want MigrateTx refused, got %v", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// Nothing ran: the caller's row rolled back with its transaction,
		// and no millbox table appeared.
		var n int
		if err := raw.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+own+"`").Scan(&n); err != nil || n != 0 {
			t.Fatalf("caller's transaction committed: %d rows, %v", n, err)
		}
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?`,
			strings.Trim(d.OutboxTable(), "`")+"%").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d millbox tables after a refused MigrateTx (%v)", n, err)
		}
	})

	t.Run("OwnDatabase", func(t *testing.T) {
		name := testenv.UniqueName("db_")
		t.Cleanup(func() { raw.Exec("DROP DATABASE IF EXISTS `" + name + "`") })
		d := mysql.MustNew(mysql.Options{Database: name})
		if err := sqladapters.Migrate(ctx, db, d); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range d.InsertOutbox([]sqladapters.OutboxMessage{{Topic: "t", UUID: "u"}}) {
			if _, err := q.Exec(ctx, tx); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if rows := conformance.ReadPending(t, ctx, db, d); len(rows) != 1 {
			t.Fatalf("%d rows in %s", len(rows), d.OutboxTable())
		}
	})
}

// myShape describes the columns and indexes of d's tables, with the table
// prefix removed so two installations compare equal.
func myShape(t *testing.T, ctx context.Context, db *sql.DB, d *mysql.Dialect) string {
	t.Helper()
	prefix := strings.Trim(d.OutboxTable(), "`")
	rows, err := db.QueryContext(ctx, `
SELECT CONCAT(table_name, '.', column_name, ':', column_type, ':', is_nullable, ':', COALESCE(generation_expression, ''))
FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name LIKE ? AND table_name NOT LIKE '%\_migrations'
UNION ALL
SELECT CONCAT(table_name, ' index ', index_name, ':', GROUP_CONCAT(column_name ORDER BY seq_in_index))
FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name LIKE ? AND table_name NOT LIKE '%\_migrations'
GROUP BY table_name, index_name
ORDER BY 1`, prefix+"%", prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.TrimPrefix(s, prefix))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func newMyOps(t *testing.T, opts mysql.Options) *dialectOps {
	raw := testenv.MySQL(t)
	return &dialectOps{t: t, ctx: testenv.Ctx(t, time.Minute), db: stdsql.WrapDB(raw), d: testenv.MySQLDialect(t, raw, opts)}
}

func uuidsOf(rows []conformance.Row) string {
	var s []string
	for _, r := range rows {
		s = append(s, r.UUID)
	}
	return strings.Join(s, " ")
}

func TestMySQLForwarderStatements(t *testing.T) {
	t.Run("PendingOrderPartitionsExclusion", func(t *testing.T) {
		o := newMyOps(t, mysql.Options{})
		var msgs []sqladapters.OutboxMessage
		for i := range 8 {
			msgs = append(msgs, sqladapters.OutboxMessage{UUID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i), KeyHash: int32(i * 5)})
		}
		ids := o.insert(msgs...)
		all := o.pending(sqladapters.PendingQuery{Limit: 100})
		if got := uuidsOf(all); got != "m0 m1 m2 m3 m4 m5 m6 m7" {
			t.Fatalf("pending %s", got)
		}
		// key_hash % 4: m0 0, m1 1, m2 2, m3 3, m4 0, m5 1, m6 2, m7 3.
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, Limit: 100})); got != "m1 m3 m5 m7" {
			t.Fatalf("partitions 1,3: %s", got)
		}
		if got := o.pending(sqladapters.PendingQuery{Partitions: 4, Owned: []int{}, Limit: 100}); len(got) != 0 {
			t.Fatalf("no owned partitions read %s", uuidsOf(got))
		}
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Exclude: []int64{ids[0], ids[5]}, Limit: 3})); got != "m1 m2 m3" {
			t.Fatalf("excluded m0, m5, limit 3: %s", got)
		}
		o.exec(o.d.CompleteForwarded(ids[:2], false))
		o.exec(o.d.CompleteForwarded(ids[2:3], true))
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Limit: 100})); got != "m3 m4 m5 m6 m7" {
			t.Fatalf("after completing m0-m2: %s", got)
		}
		var published int
		if err := testenv.MySQL(t).QueryRowContext(o.ctx, `SELECT COUNT(*) FROM `+o.d.OutboxTable()+` WHERE published_at IS NOT NULL`).Scan(&published); err != nil || published != 1 {
			t.Fatalf("published rows kept: %d, %v", published, err)
		}
	})

	t.Run("BackoffHoldsBackItsKeyOnly", func(t *testing.T) {
		o := newMyOps(t, mysql.Options{})
		// a1, a2 share key a; x has another key with the same hash; b has
		// its own; n1, n2 have no key.
		ids := o.insert(
			sqladapters.OutboxMessage{UUID: "a1", Key: "a", KeyHash: 7},
			sqladapters.OutboxMessage{UUID: "n1", KeyHash: 1},
			sqladapters.OutboxMessage{UUID: "a2", Key: "a", KeyHash: 7},
			sqladapters.OutboxMessage{UUID: "x", Key: "x", KeyHash: 7},
			sqladapters.OutboxMessage{UUID: "b", Key: "b", KeyHash: 2},
			sqladapters.OutboxMessage{UUID: "n2", KeyHash: 1},
		)
		o.exec(o.d.RecordFailure(sqladapters.Failure{ID: ids[0], Attempts: 1, Error: "down", Backoff: time.Hour}))
		o.exec(o.d.RecordFailure(sqladapters.Failure{ID: ids[1], Attempts: 1, Error: "down", Backoff: time.Hour}))
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Limit: 100})); got != "x b n2" {
			t.Fatalf("with a1 and n1 backing off: %s (want a2 held back, x and n2 free)", got)
		}
		// Due again: a1 comes first, then a2.
		o.exec(o.d.RecordFailure(sqladapters.Failure{ID: ids[0], Attempts: 2, Error: "down", Backoff: 0}))
		rows := o.pending(sqladapters.PendingQuery{Limit: 100})
		if got := uuidsOf(rows); got != "a1 a2 x b n2" || rows[0].Attempts != 2 {
			t.Fatalf("with a1 due: %s (attempts %d)", got, rows[0].Attempts)
		}
		// A dead row does not hold its key back.
		o.exec(o.d.RecordFailure(sqladapters.Failure{ID: ids[0], Attempts: 3, Error: "gone", Backoff: time.Hour, Dead: true}))
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Limit: 100})); got != "a2 x b n2" {
			t.Fatalf("with a1 dead: %s", got)
		}
	})

	// The backoff check runs once per row read; if it scanned the table,
	// reading a batch would cost batch × backlog. The plan must use
	// state_idx for the rows and retry_idx for the check, with statistics
	// that see retry_hash as almost all NULL.
	t.Run("PendingPlanUsesIndexes", func(t *testing.T) {
		o := newMyOps(t, mysql.Options{})
		raw := testenv.MySQL(t)
		msgs := make([]sqladapters.OutboxMessage, 3000)
		for i := range msgs {
			msgs[i] = sqladapters.OutboxMessage{UUID: fmt.Sprint("m", i), Topic: "t", Metadata: []byte("{}"), Key: fmt.Sprint("k", i%3), KeyHash: int32(i % 3)}
		}
		for _, q := range o.d.InsertOutbox(msgs) {
			o.exec(q)
		}
		if _, err := raw.ExecContext(o.ctx, `ANALYZE TABLE `+o.d.OutboxTable()); err != nil {
			t.Fatal(err)
		}
		for _, q := range []sqladapters.PendingQuery{
			{Limit: 2000},
			{Partitions: 16, Owned: []int{0, 1, 2}, Exclude: []int64{1, 2, 3}, Limit: 2000},
		} {
			sel := o.d.SelectPending(q)
			rows, err := raw.QueryContext(o.ctx, "EXPLAIN "+sel.SQL, sel.Args...)
			if err != nil {
				t.Fatal(err)
			}
			plan := explainRows(t, rows)
			if len(plan) != 2 {
				t.Fatalf("plan has %d rows, want 2: %v", len(plan), plan)
			}
			for _, r := range plan {
				want := map[string]string{"o": "state_idx", "p": "retry_idx"}[r["table"]]
				if r["type"] == "ALL" || r["key"] != want {
					t.Fatalf("table %s: access %s via %q, want index %s\n%v\n%s", r["table"], r["type"], r["key"], want, plan, sel.SQL)
				}
			}
			if q.Owned == nil {
				continue
			}
			// An instance owning some partitions tests each row's partition
			// in the index, not in the row.
			var js string
			if err := raw.QueryRowContext(o.ctx, "EXPLAIN FORMAT=JSON "+sel.SQL, sel.Args...).Scan(&js); err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`"index_condition":\s*"[^"]*key_hash`).MatchString(js) {
				t.Fatalf("the partition test is not pushed into state_idx:\n%s", js)
			}
		}
	})

	t.Run("DeadLettersAndRequeue", func(t *testing.T) {
		o := newMyOps(t, mysql.Options{})
		ids := o.insert(sqladapters.OutboxMessage{UUID: "d1", Key: "k"}, sqladapters.OutboxMessage{UUID: "d2"}, sqladapters.OutboxMessage{UUID: "ok"})
		for _, id := range ids[:2] {
			o.exec(o.d.RecordFailure(sqladapters.Failure{ID: id, Attempts: 1, Error: "first", Backoff: time.Millisecond}))
			o.exec(o.d.RecordFailure(sqladapters.Failure{ID: id, Attempts: 2, Error: fmt.Sprint("last of ", id), Dead: true}))
		}
		if got := uuidsOf(o.pending(sqladapters.PendingQuery{Limit: 100})); got != "ok" {
			t.Fatalf("pending with two dead rows: %s", got)
		}
		dead := myDeadLetters(t, o, 0, 10)
		if len(dead) != 2 || dead[0].UUID != "d1" || dead[0].Key != "k" || dead[0].Attempts != 2 ||
			dead[0].LastError != fmt.Sprint("last of ", ids[0]) || dead[0].DeadAt.IsZero() || dead[1].UUID != "d2" {
			t.Fatalf("dead letters %+v", dead)
		}
		if page := myDeadLetters(t, o, dead[0].ID, 10); len(page) != 1 || page[0].ID != dead[1].ID {
			t.Fatalf("second page %+v", page)
		}
		if n := o.exec(o.d.RequeueDeadLetters([]int64{ids[1]})); n != 1 {
			t.Fatalf("requeued %d", n)
		}
		rows := o.pending(sqladapters.PendingQuery{Limit: 100})
		if got := uuidsOf(rows); got != "d2 ok" || rows[0].Attempts != 0 {
			t.Fatalf("after requeue of d2: %s", got)
		}
		if n := o.exec(o.d.RequeueDeadLetters(nil)); n != 1 {
			t.Fatalf("requeue all: %d", n)
		}
		if dead := myDeadLetters(t, o, 0, 10); len(dead) != 0 {
			t.Fatalf("dead after requeue all: %+v", dead)
		}
	})

	for _, skip := range []bool{false, true} {
		t.Run(fmt.Sprint("Leases/SkipLocked=", skip), func(t *testing.T) {
			o := newMyOps(t, mysql.Options{SkipLocked: skip})
			if skip {
				if ok, _ := mysql.DetectSkipLocked(o.ctx, o.db); !ok {
					t.Skip("server without SKIP LOCKED")
				}
			}
			for _, q := range o.d.EnsurePartitions(8) {
				o.exec(q)
			}
			owned := func(inst string) string { return fmt.Sprint(o.ints(o.d.OwnedPartitions(inst))) }
			o.exec(o.d.Heartbeat("A", time.Minute))
			o.exec(o.d.Heartbeat("B", time.Minute))
			if n := o.ints(o.d.CountMembers()); n[0] != 2 {
				t.Fatalf("members %v", n)
			}
			o.exec(o.d.ClaimPartitions("A", time.Minute, 4))
			o.exec(o.d.ClaimPartitions("B", time.Minute, 8))
			if a, b := owned("A"), owned("B"); a != "[0 1 2 3]" || b != "[4 5 6 7]" {
				t.Fatalf("A %s, B %s", a, b)
			}
			if n := o.exec(o.d.ClaimPartitions("A", time.Minute, 4)); n != 0 {
				t.Fatalf("A claimed %d taken partitions", n)
			}
			// Release hands partitions to the next claimer.
			o.exec(o.d.ReleasePartitions("B", []int{6, 7}))
			o.exec(o.d.ReleasePartitions("A", []int{4})) // not A's: no effect
			o.exec(o.d.ClaimPartitions("A", time.Minute, 8))
			if a, b := owned("A"), owned("B"); a != "[0 1 2 3 6 7]" || b != "[4 5]" {
				t.Fatalf("after release: A %s, B %s", a, b)
			}
			// B's leases expire; A takes them over, and B can no longer
			// renew them.
			o.exec(o.d.ReleasePartitions("B", []int{4, 5}))
			o.exec(o.d.ClaimPartitions("B", 300*time.Millisecond, 2))
			if b := owned("B"); b != "[4 5]" {
				t.Fatalf("B %s", b)
			}
			if n := o.exec(o.d.RenewPartitions("B", 300*time.Millisecond)); n != 2 {
				t.Fatalf("B renewed %d", n)
			}
			time.Sleep(400 * time.Millisecond)
			if b := owned("B"); b != "[]" {
				t.Fatalf("B still owns %s after expiry", b)
			}
			if n := o.exec(o.d.RenewPartitions("B", time.Minute)); n != 0 {
				t.Fatalf("B renewed %d expired leases", n)
			}
			o.exec(o.d.ClaimPartitions("A", time.Minute, 8))
			if a := owned("A"); a != "[0 1 2 3 4 5 6 7]" {
				t.Fatalf("A after takeover %s", a)
			}
			o.exec(o.d.RemoveMember("B"))
			if n := o.ints(o.d.CountMembers()); n[0] != 1 {
				t.Fatalf("members after remove %v", n)
			}
		})

		t.Run(fmt.Sprint("ConcurrentClaims/SkipLocked=", skip), func(t *testing.T) {
			o := newMyOps(t, mysql.Options{SkipLocked: skip})
			if skip {
				if ok, _ := mysql.DetectSkipLocked(o.ctx, o.db); !ok {
					t.Skip("server without SKIP LOCKED")
				}
			}
			const partitions, instances = 32, 8
			for _, q := range o.d.EnsurePartitions(partitions) {
				o.exec(q)
			}
			var wg sync.WaitGroup
			errs := make(chan error, instances*10)
			for i := range instances {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 10 {
						if _, err := o.d.ClaimPartitions(fmt.Sprint("i", i), time.Minute, 3).Exec(o.ctx, o.db); err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			seen := map[int64]string{}
			total := 0
			for i := range instances {
				inst := fmt.Sprint("i", i)
				for _, p := range o.ints(o.d.OwnedPartitions(inst)) {
					if prev, ok := seen[p]; ok {
						t.Fatalf("partition %d owned by %s and %s", p, prev, inst)
					}
					seen[p] = inst
					total++
				}
			}
			if total != partitions {
				t.Fatalf("%d of %d partitions claimed", total, partitions)
			}
		})
	}
}

func myDeadLetters(t *testing.T, o *dialectOps, after int64, limit int) []sqladapters.DeadLetter {
	t.Helper()
	dead, err := forwarder.DeadLetters(o.ctx, o.db, o.d, after, limit)
	if err != nil {
		t.Fatal(err)
	}
	return dead
}

// explainRows reads EXPLAIN output as one column map per row.
func explainRows(t *testing.T, rows *sql.Rows) []map[string]string {
	t.Helper()
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		r := map[string]string{}
		for i, c := range cols {
			r[c] = vals[i].String
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
