package mysql_test

import (
	"context"
	"crypto/sha1"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/mysqltest"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// dsnVariants are the two protocols of go-sql-driver/mysql: server-side
// prepared statements (the default) and client-side interpolation.
func dsnVariants(t *testing.T) map[string]string {
	return map[string]string{
		"prepared":    mysqltest.DSN(),
		"interpolate": mysqltest.DSNWith(t, func(c *mysqldrv.Config) { c.InterpolateParams = true }),
	}
}

// TestMySQLDialectOnServer runs every statement the dialect builds against
// the server, with both protocols and both claim variants, and checks what
// the simple ones return.
func TestMySQLDialectOnServer(t *testing.T) {
	for proto, dsn := range dsnVariants(t) {
		for _, skip := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/SkipLocked=%v", proto, skip), func(t *testing.T) {
				t.Parallel()
				raw := mysqltest.Open(t, dsn)
				db := stdsql.WrapDB(raw)
				ctx := dialecttest.Ctx(t, time.Minute)
				d := mysqltest.Dialect(t, raw, mysql.Options{SkipLocked: skip})

				exec := func(q sqladapters.Query) int64 {
					t.Helper()
					n, err := q.Exec(ctx, db)
					if err != nil {
						t.Fatalf("%s: %v", q.SQL, d.ClassifyError(err))
					}
					return n
				}
				queryInts := func(q sqladapters.Query) []int64 {
					t.Helper()
					rows, err := q.Query(ctx, db)
					if err != nil {
						t.Fatalf("%s: %v", q.SQL, err)
					}
					defer rows.Close()
					var out []int64
					for rows.Next() {
						var v int64
						if err := rows.Scan(&v); err != nil {
							t.Fatal(err)
						}
						out = append(out, v)
					}
					if err := rows.Err(); err != nil {
						t.Fatal(err)
					}
					return out
				}

				payload := make([]byte, 256)
				for i := range payload {
					payload[i] = byte(i)
				}
				msgs := []sqladapters.OutboxMessage{
					{Topic: "t", UUID: "a", Payload: payload, Metadata: []byte(`{"emoji":"😀","q":"'\"\\"}`), Key: "k", KeyHash: 5},
					{Topic: "t", UUID: "b", Payload: nil, Metadata: nil},
				}
				for _, q := range d.InsertOutbox(msgs) {
					exec(q)
				}
				rows, err := d.SelectPending(sqladapters.PendingQuery{Limit: 10}).Query(ctx, db)
				if err != nil {
					t.Fatal(err)
				}
				var got []sqladapters.OutboxRow
				for rows.Next() {
					var r sqladapters.OutboxRow
					var key sql.NullString
					if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &r.Metadata, &key, &r.Attempts); err != nil {
						t.Fatal(err)
					}
					r.Key = key.String
					got = append(got, r)
				}
				rows.Close()
				if len(got) != 2 || string(got[0].Payload) != string(payload) || string(got[0].Metadata) != string(msgs[0].Metadata) ||
					got[0].Key != "k" || got[1].Payload == nil || len(got[1].Payload) != 0 || string(got[1].Metadata) != "{}" || got[1].Key != "" {
					t.Fatalf("rows read back: %+v", got)
				}

				exec(d.RecordFailure(sqladapters.Failure{ID: got[0].ID, Attempts: 1, Error: "boom \xff", Dead: true}))
				dl, err := d.ListDeadLetters(0, 10).Query(ctx, db)
				if err != nil {
					t.Fatal(err)
				}
				var dead sqladapters.DeadLetter
				var key sql.NullString
				if !dl.Next() {
					t.Fatal("no dead letter")
				}
				if err := dl.Scan(&dead.ID, &dead.Topic, &dead.UUID, &dead.Payload, &dead.Metadata, &key, &dead.Attempts,
					&dead.LastError, &dead.CreatedAt, &dead.DeadAt); err != nil {
					t.Fatal(err)
				}
				dl.Close()
				if dead.ID != got[0].ID || dead.LastError != "boom \uFFFD" || dead.Attempts != 1 ||
					time.Since(dead.CreatedAt).Abs() > time.Minute || dead.DeadAt.Before(dead.CreatedAt) || dead.CreatedAt.Location() != time.UTC {
					t.Fatalf("dead letter %+v", dead)
				}
				if n := exec(d.RequeueDeadLetters([]int64{})); n != 0 {
					t.Fatalf("requeue of no ids changed %d rows", n)
				}
				if n := exec(d.RequeueDeadLetters(nil)); n != 1 {
					t.Fatalf("requeue all changed %d rows", n)
				}
				exec(d.CompleteForwarded([]int64{got[0].ID}, true))
				exec(d.CompleteForwarded([]int64{got[1].ID}, false))
				exec(d.CompleteForwarded(nil, false))
				if ids := queryInts(d.SelectPending(sqladapters.PendingQuery{Limit: 10})); len(ids) != 0 {
					t.Fatalf("pending after completion: %v", ids)
				}

				for _, q := range d.EnsurePartitions(4) {
					exec(q)
				}
				for _, q := range d.EnsurePartitions(4) { // idempotent
					exec(q)
				}
				if n := queryInts(d.CountPartitions()); n[0] != 4 {
					t.Fatalf("%d partitions", n[0])
				}
				long := strings.Repeat("i", 300) // stored as its digest
				for _, inst := range []string{"a", long} {
					exec(d.Heartbeat(inst, time.Minute))
					exec(d.Heartbeat(inst, time.Minute))
				}
				if n := queryInts(d.CountMembers()); n[0] != 2 {
					t.Fatalf("%d members", n[0])
				}
				if n := exec(d.ClaimPartitions("a", time.Minute, 3)); n != 3 {
					t.Fatalf("claimed %d", n)
				}
				if n := exec(d.ClaimPartitions(long, time.Minute, 3)); n != 1 {
					t.Fatalf("second instance claimed %d", n)
				}
				if p := queryInts(d.OwnedPartitions(long)); fmt.Sprint(p) != "[3]" {
					t.Fatalf("long instance owns %v", p)
				}
				if n := exec(d.RenewPartitions("a", time.Minute)); n != 3 {
					t.Fatalf("renewed %d", n)
				}
				exec(d.ReleasePartitions("a", []int{0, 2}))
				exec(d.ReleasePartitions("a", nil))
				if p := queryInts(d.OwnedPartitions("a")); fmt.Sprint(p) != "[1]" {
					t.Fatalf("owns %v after release", p)
				}
				exec(d.RemoveMember(long))
				if n := queryInts(d.CountMembers()); n[0] != 1 {
					t.Fatalf("%d members after remove", n[0])
				}

				if n := exec(d.InsertInbox("c", "m")); n != 1 {
					t.Fatalf("first insert affected %d", n)
				}
				if n := exec(d.InsertInbox("c", "m")); n != 0 {
					t.Fatalf("duplicate insert affected %d", n)
				}
				if n := exec(d.DeleteInboxBefore(time.Now().Add(-time.Hour), 10)); n != 0 {
					t.Fatalf("deleted %d recent rows", n)
				}
				if n := exec(d.DeleteInboxBefore(time.Now().Add(time.Minute), 10)); n != 1 {
					t.Fatalf("deleted %d old rows", n)
				}
			})
		}
	}
}

// TestMySQLInboxKeysAreExact checks that keys differing only in case,
// trailing spaces or beyond the column width stay distinct.
func TestMySQLInboxKeysAreExact(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := mysqltest.Dialect(t, raw, mysql.Options{})
	long := strings.Repeat("m", 1024)
	keys := [][2]string{
		{"c", "abc"}, {"c", "ABC"}, {"c", "abc "}, {"c", "ábc"}, {"C", "abc"},
		{"c", long}, {"c", long[:1023] + "n"}, {"c", long[:600]}, {strings.Repeat("c", 1024), "abc"},
	}
	for _, k := range keys {
		if n, err := d.InsertInbox(k[0], k[1]).Exec(ctx, db); err != nil || n != 1 {
			t.Fatalf("%.20q/%.20q first insert: %d, %v", k[0], k[1], n, err)
		}
	}
	for _, k := range keys {
		if n, err := d.InsertInbox(k[0], k[1]).Exec(ctx, db); err != nil || n != 0 {
			t.Fatalf("%.20q/%.20q duplicate: %d, %v", k[0], k[1], n, err)
		}
	}
}

// TestMySQLInboxConcurrentDuplicate runs two real transactions inserting
// the same key: the second waits for the first and then sees a duplicate
// if it committed, or inserts if it rolled back.
func TestMySQLInboxConcurrentDuplicate(t *testing.T) {
	raw := mysqltest.DB(t)
	d := mysqltest.Dialect(t, raw, mysql.Options{})
	for _, iso := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted} {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v/commit=%v", iso, commit), func(t *testing.T) {
				ctx := dialecttest.Ctx(t, 30*time.Second)
				id := dialecttest.UniqueName("m")
				begin := func() *sql.Tx {
					tx, err := raw.BeginTx(ctx, &sql.TxOptions{Isolation: iso})
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback() })
					return tx
				}
				first, second := begin(), begin()
				// The second transaction takes its snapshot before the
				// first inserts, the case REPEATABLE READ makes hard.
				snap, err := d.CountMembers().Query(ctx, stdsql.WrapTx(second))
				if err != nil {
					t.Fatal(err)
				}
				for snap.Next() {
				}
				snap.Close()
				if n, err := d.InsertInbox("c", id).Exec(ctx, stdsql.WrapTx(first)); err != nil || n != 1 {
					t.Fatalf("first: %d, %v", n, err)
				}
				type result struct {
					n   int64
					err error
				}
				done := make(chan result, 1)
				go func() {
					n, err := d.InsertInbox("c", id).Exec(ctx, stdsql.WrapTx(second))
					done <- result{n, err}
				}()
				select {
				case r := <-done:
					t.Fatalf("second insert did not wait for the first transaction: %d, %v", r.n, r.err)
				case <-time.After(300 * time.Millisecond):
				}
				if commit {
					if err := first.Commit(); err != nil {
						t.Fatal(err)
					}
				} else if err := first.Rollback(); err != nil {
					t.Fatal(err)
				}
				r := <-done
				want := int64(0)
				if !commit {
					want = 1
				}
				if r.err != nil || r.n != want {
					t.Fatalf("second insert after the first %s: %d, %v; want %d", map[bool]string{true: "committed", false: "rolled back"}[commit], r.n, r.err, want)
				}
				if err := second.Commit(); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// lockFree reports whether the migration lock of d is free.
func lockFree(t *testing.T, ctx context.Context, raw *sql.DB, d *mysql.Dialect) bool {
	t.Helper()
	db := d.Database()
	if db == "" {
		if err := raw.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&db); err != nil {
			t.Fatal(err)
		}
	}
	sum := sha1.Sum([]byte(db + "." + strings.Trim(d.OutboxTable()[strings.LastIndex(d.OutboxTable(), ".")+1:], "`")))
	var free int
	if err := raw.QueryRowContext(ctx, `SELECT IS_FREE_LOCK(?)`, "millbox_migrate_"+hex.EncodeToString(sum[:])).Scan(&free); err != nil {
		t.Fatal(err)
	}
	return free == 1
}

func TestMySQLMigrationLock(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)

	t.Run("TimeoutNamesTheLock", func(t *testing.T) {
		opts := mysqltest.Names(t, raw, mysql.Options{MigrationLockTimeout: time.Second})
		d := mysql.MustNew(opts)
		holder, err := raw.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		lock, unlock := d.LockMigrations()
		if _, err := holder.ExecContext(ctx, lock.SQL, lock.Args...); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = sqladapters.Migrate(ctx, db, d)
		if err == nil || !strings.Contains(err.Error(), "migration lock") {
			t.Fatalf("want a lock timeout, got %v", err)
		}
		if waited := time.Since(start); waited < time.Second || waited > 10*time.Second {
			t.Fatalf("waited %v for a 1s lock timeout", waited)
		}
		if _, err := holder.ExecContext(ctx, unlock.SQL, unlock.Args...); err != nil {
			t.Fatal(err)
		}
		if err := sqladapters.Migrate(ctx, db, d); err != nil {
			t.Fatalf("migrate after release: %v", err)
		}
	})

	t.Run("StaleLockOnSameConnection", func(t *testing.T) {
		d := mysql.MustNew(mysqltest.Names(t, raw, mysql.Options{}))
		conn, err := raw.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		lock, unlock := d.LockMigrations()
		for range 2 { // an interrupted run left the lock, then a new run takes it
			if _, err := conn.ExecContext(ctx, lock.SQL, lock.Args...); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := conn.ExecContext(ctx, unlock.SQL, unlock.Args...); err != nil {
			t.Fatal(err)
		}
		if !lockFree(t, ctx, raw, d) {
			t.Fatal("one release left the lock held")
		}
	})

	t.Run("FailedMigrationReleasesLock", func(t *testing.T) {
		opts := mysqltest.Names(t, raw, mysql.Options{})
		d := mysql.MustNew(opts)
		// A version table of another shape makes recording fail after
		// the lock was taken and the tables were created.
		if _, err := raw.ExecContext(ctx, "CREATE TABLE `"+opts.OutboxTable+"_migrations` (version INT PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		raw.SetMaxOpenConns(1) // the failed migration's connection is reused
		defer raw.SetMaxOpenConns(20)
		if err := sqladapters.Migrate(ctx, db, d); err == nil {
			t.Fatal("migration with a broken version table succeeded")
		}
		other := mysqltest.DB(t)
		if !lockFree(t, ctx, other, d) {
			t.Fatal("a failed migration left its lock on a pooled connection")
		}
	})
}

func TestMySQLClassifyErrorFromServer(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	missing := mysql.MustNew(mysql.Options{OutboxTable: dialecttest.UniqueName("missing_")})
	missingDB := mysql.MustNew(mysql.Options{Database: dialecttest.UniqueName("nodb_")})
	for _, d := range []*mysql.Dialect{missing, missingDB} {
		_, err := d.InsertOutbox([]sqladapters.OutboxMessage{{Topic: "t", UUID: "u"}})[0].Exec(ctx, db)
		if err = d.ClassifyError(err); !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
			t.Fatalf("want ErrMissingTable, got %v", err)
		}
	}
	d := mysqltest.Dialect(t, raw, mysql.Options{})
	_, err := db.Exec(ctx, "INSERT INTO "+d.Tables()[4]+" (version, name, applied_at) VALUES (1, 'again', UTC_TIMESTAMP(6))")
	if err = d.ClassifyError(err); !errors.Is(err, sqladapters.ErrDuplicate) {
		t.Fatalf("want ErrDuplicate, got %v", err)
	}
}

func TestMySQLDetectSkipLocked(t *testing.T) {
	raw := mysqltest.DB(t)
	ctx := dialecttest.Ctx(t, time.Minute)
	var version string
	if err := raw.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	has, err := mysql.DetectSkipLocked(ctx, stdsql.WrapDB(raw))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("server %s: SKIP LOCKED %v", version, has)
	// Whatever the answer, the server must accept the SKIP LOCKED claim
	// exactly when DetectSkipLocked says so.
	d := mysqltest.Dialect(t, raw, mysql.Options{SkipLocked: true})
	_, err = d.ClaimPartitions("a", time.Second, 1).Exec(ctx, stdsql.WrapDB(raw))
	if has != (err == nil) {
		t.Fatalf("DetectSkipLocked %v, SKIP LOCKED claim: %v", has, err)
	}
}

// TestMySQLSkipLockedClaimDoesNotWait holds a lease row locked and claims
// next to it: the SKIP LOCKED claim takes the other rows at once.
func TestMySQLSkipLockedClaimDoesNotWait(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	if ok, err := mysql.DetectSkipLocked(ctx, db); err != nil || !ok {
		t.Skipf("server without SKIP LOCKED (%v)", err)
	}
	d := mysqltest.Dialect(t, raw, mysql.Options{SkipLocked: true})
	for _, q := range d.EnsurePartitions(4) {
		if _, err := q.Exec(ctx, db); err != nil {
			t.Fatal(err)
		}
	}
	tx, err := raw.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT * FROM "+d.Tables()[1]+" WHERE `partition` = 0 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	n, err := d.ClaimPartitions("b", time.Minute, 4).Exec(cctx, db)
	if err != nil || n != 3 {
		t.Fatalf("claim next to a locked row: %d, %v", n, err)
	}
}

// TestMySQLLargeInsert publishes more than one statement's budget, with
// every byte value in the payloads, through both protocols.
func TestMySQLLargeInsert(t *testing.T) {
	for proto, dsn := range dsnVariants(t) {
		t.Run(proto, func(t *testing.T) {
			raw := mysqltest.Open(t, dsn)
			db := stdsql.WrapDB(raw)
			ctx := dialecttest.Ctx(t, time.Minute)
			d := mysqltest.Dialect(t, raw, mysql.Options{MaxInsertBytes: 1 << 20})
			payload := make([]byte, 100<<10)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			msgs := make([]sqladapters.OutboxMessage, 30)
			for i := range msgs {
				msgs[i] = sqladapters.OutboxMessage{Topic: "big", UUID: fmt.Sprint(i), Payload: payload, Metadata: []byte("{}")}
			}
			qs := d.InsertOutbox(msgs)
			if len(qs) < 3 {
				t.Fatalf("%d statements for 3 MB", len(qs))
			}
			tx, err := db.Begin(ctx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range qs {
				if _, err := q.Exec(ctx, tx); err != nil {
					sqladapters.Rollback(tx)
					t.Fatal(err)
				}
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			rows, err := d.SelectPending(sqladapters.PendingQuery{Limit: 100}).Query(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			i, last := 0, int64(0)
			for rows.Next() {
				var r sqladapters.OutboxRow
				var key sql.NullString
				if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &r.Metadata, &key, &r.Attempts); err != nil {
					t.Fatal(err)
				}
				if r.UUID != fmt.Sprint(i) || r.ID <= last || string(r.Payload) != string(payload) {
					t.Fatalf("row %d: uuid %s id %d after %d, payload intact %v", i, r.UUID, r.ID, last, string(r.Payload) == string(payload))
				}
				i, last = i+1, r.ID
			}
			if i != len(msgs) {
				t.Fatalf("%d rows", i)
			}
		})
	}
}

// TestMySQLTimesIgnoreSessionTimeZone runs leases and inbox cleanup from
// two sessions nine and five hours off UTC, with the driver's loc set to
// match: both must agree on every expiry.
func TestMySQLTimesIgnoreSessionTimeZone(t *testing.T) {
	open := func(offset int) sqladapters.DB {
		cfg, err := mysqldrv.ParseDSN(mysqltest.DSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.Loc = time.FixedZone("session", offset*3600)
		cfg.Params = map[string]string{"time_zone": fmt.Sprintf("'%+03d:00'", offset)}
		conn, err := mysqldrv.NewConnector(cfg)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		t.Cleanup(func() { db.Close() })
		return stdsql.WrapDB(db)
	}
	east, west := open(9), open(-5)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := mysqltest.Dialect(t, mysqltest.DB(t), mysql.Options{})
	run := func(db sqladapters.DB, q sqladapters.Query) int64 {
		t.Helper()
		n, err := q.Exec(ctx, db)
		if err != nil {
			t.Fatalf("%s: %v", q.SQL, err)
		}
		return n
	}
	count := func(db sqladapters.DB, q sqladapters.Query) int {
		t.Helper()
		rows, err := q.Query(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			n++
		}
		return n
	}
	for _, q := range d.EnsurePartitions(4) {
		run(east, q)
	}
	run(east, d.Heartbeat("a", time.Minute))
	run(east, d.ClaimPartitions("a", time.Minute, 4))
	if n := count(west, d.OwnedPartitions("a")); n != 4 {
		t.Fatalf("the western session sees %d of a's 4 leases", n)
	}
	if n := run(west, d.ClaimPartitions("b", time.Minute, 4)); n != 0 {
		t.Fatalf("the western session took %d unexpired leases", n)
	}
	run(east, d.InsertInbox("c", "m"))
	if n := run(west, d.DeleteInboxBefore(time.Now().Add(-time.Minute), 10)); n != 0 {
		t.Fatalf("cleanup deleted %d fresh rows", n)
	}
	if n := run(west, d.DeleteInboxBefore(time.Now().Add(time.Minute), 10)); n != 1 {
		t.Fatalf("cleanup deleted %d old rows", n)
	}
}
