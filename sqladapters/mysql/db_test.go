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
	"github.com/millbox/millbox/sqladapters/internal/storetest"
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

// TestStore runs the store contract's suite with both protocols, and
// with both claim variants where the server has SKIP LOCKED.
func TestStore(t *testing.T) {
	skip, err := mysql.DetectSkipLocked(dialecttest.Ctx(t, time.Minute), stdsql.WrapDB(mysqltest.DB(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		proto string
		opts  mysql.Options
	}{
		{"prepared", mysql.Options{}},
		{"interpolate", mysql.Options{SkipLocked: skip}},
	} {
		t.Run(fmt.Sprintf("%s/SkipLocked=%v", c.proto, c.opts.SkipLocked), func(t *testing.T) {
			raw := mysqltest.Open(t, dsnVariants(t)[c.proto])
			storetest.Run(t, storetest.Setup{
				DB:    stdsql.WrapDB(raw),
				New:   func(t *testing.T) sqladapters.Dialect { return mysqltest.Fresh(t, raw, c.opts) },
				InUse: func() int { return raw.Stats().InUse },
			})
		})
	}
}

// TestFleetStore runs the fleet store's suite with both protocols, and
// with both claim variants where the server has SKIP LOCKED.
func TestFleetStore(t *testing.T) {
	skip, err := mysql.DetectSkipLocked(dialecttest.Ctx(t, time.Minute), stdsql.WrapDB(mysqltest.DB(t)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		proto string
		opts  mysql.FleetOptions
	}{
		{"prepared", mysql.FleetOptions{}},
		{"interpolate", mysql.FleetOptions{SkipLocked: skip}},
	} {
		t.Run(fmt.Sprintf("%s/SkipLocked=%v", c.proto, c.opts.SkipLocked), func(t *testing.T) {
			raw := mysqltest.Open(t, dsnVariants(t)[c.proto])
			storetest.RunFleet(t, storetest.FleetSetup{
				DB:    stdsql.WrapDB(raw),
				New:   func(t *testing.T) sqladapters.FleetStore { return mysqltest.FreshFleet(t, raw, c.opts) },
				InUse: func() int { return raw.Stats().InUse },
			})
		})
	}
}

// TestMySQLValuesOnServer checks what MySQL stores differently from the
// other databases: a nil payload and metadata, metadata kept byte for byte,
// an error that is not UTF-8, and times in UTC.
func TestMySQLValuesOnServer(t *testing.T) {
	for proto, dsn := range dsnVariants(t) {
		t.Run(proto, func(t *testing.T) {
			raw := mysqltest.Open(t, dsn)
			db := stdsql.WrapDB(raw)
			ctx := dialecttest.Ctx(t, time.Minute)
			d := mysqltest.Dialect(t, raw, mysql.Options{})
			msgs := []sqladapters.OutboxMessage{
				{Topic: "t", UUID: "a", Payload: []byte{0, 1, 2}, Metadata: []byte(`{"emoji":"😀","q":"'\"\\"}`), Key: "k", KeyHash: 5},
				{Topic: "t", UUID: "b", Payload: nil, Metadata: nil},
			}
			if err := d.InsertOutbox(ctx, db, msgs); err != nil {
				t.Fatal(err)
			}
			got, err := d.ReadPending(ctx, db, sqladapters.PendingQuery{Limit: 10}, false)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || string(got[0].Metadata) != string(msgs[0].Metadata) ||
				got[1].Payload == nil || len(got[1].Payload) != 0 || string(got[1].Metadata) != "{}" || got[1].Key != "" {
				t.Fatalf("rows read back: %+v", got)
			}
			if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: got[0].ID, Attempts: 1, Error: "boom \xff", Dead: true}); err != nil {
				t.Fatal(err)
			}
			dls, err := d.ListDeadLetters(ctx, db, sqladapters.DeadLetterQuery{Limit: 10})
			if err != nil {
				t.Fatal(err)
			}
			if len(dls) != 1 || dls[0].LastError != "boom \uFFFD" || time.Since(dls[0].CreatedAt).Abs() > time.Minute ||
				dls[0].CreatedAt.Location() != time.UTC || dls[0].DeadAt.Location() != time.UTC {
				t.Fatalf("dead letters %+v", dls)
			}
		})
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
		if first, err := d.RecordInbox(ctx, db, k[0], k[1]); err != nil || !first {
			t.Fatalf("%.20q/%.20q first record: %v, %v", k[0], k[1], first, err)
		}
	}
	for _, k := range keys {
		if first, err := d.RecordInbox(ctx, db, k[0], k[1]); err != nil || first {
			t.Fatalf("%.20q/%.20q duplicate: first=%v, %v", k[0], k[1], first, err)
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
				if _, err := d.CountMembers(ctx, stdsql.WrapTx(second)); err != nil {
					t.Fatal(err)
				}
				if ok, err := d.RecordInbox(ctx, stdsql.WrapTx(first), "c", id); err != nil || !ok {
					t.Fatalf("first: %v, %v", ok, err)
				}
				type result struct {
					first bool
					err   error
				}
				done := make(chan result, 1)
				go func() {
					ok, err := d.RecordInbox(ctx, stdsql.WrapTx(second), "c", id)
					done <- result{ok, err}
				}()
				select {
				case r := <-done:
					t.Fatalf("second insert did not wait for the first transaction: %v, %v", r.first, r.err)
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
				if r.err != nil || r.first == commit {
					t.Fatalf("second insert after the first %s: first=%v, %v", map[bool]string{true: "committed", false: "rolled back"}[commit], r.first, r.err)
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
	db := d.Options().Database
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
		lock, unlock := dialecttest.Builder(d).LockMigrations()
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
		lock, unlock := dialecttest.Builder(d).LockMigrations()
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
		err := d.InsertOutbox(ctx, db, []sqladapters.OutboxMessage{{Topic: "t", UUID: "u"}})
		if !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
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
	err = d.ClaimPartitions(ctx, stdsql.WrapDB(raw), "a", time.Second, 1)
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
	if err := d.EnsurePartitions(ctx, db, 4); err != nil {
		t.Fatal(err)
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
	if err := d.ClaimPartitions(cctx, db, "b", time.Minute, 4); err != nil {
		t.Fatalf("claim next to a locked row: %v", err)
	}
	if owned, err := d.OwnedPartitions(cctx, db, "b"); err != nil || len(owned) != 3 {
		t.Fatalf("claimed %v next to a locked row, want the 3 others: %v", owned, err)
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
			if n := len(dialecttest.Builder(d).InsertOutbox(msgs)); n < 3 {
				t.Fatalf("%d statements for 3 MB", n)
			}
			tx, err := db.Begin(ctx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.InsertOutbox(ctx, tx, msgs); err != nil {
				sqladapters.Rollback(tx)
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			rows, err := d.ReadPending(ctx, db, sqladapters.PendingQuery{Limit: 100}, false)
			if err != nil {
				t.Fatal(err)
			}
			i, last := 0, int64(0)
			for _, r := range rows {
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
	check := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	check(d.EnsurePartitions(ctx, east, 4))
	check(d.Heartbeat(ctx, east, "a", time.Minute))
	check(d.ClaimPartitions(ctx, east, "a", time.Minute, 4))
	owned, err := d.OwnedPartitions(ctx, west, "a")
	check(err)
	if len(owned) != 4 {
		t.Fatalf("the western session sees %d of a's 4 leases", len(owned))
	}
	check(d.ClaimPartitions(ctx, west, "b", time.Minute, 4))
	if owned, err := d.OwnedPartitions(ctx, east, "b"); err != nil || len(owned) != 0 {
		t.Fatalf("the western session took unexpired leases %v (%v)", owned, err)
	}
	if members, err := d.CountMembers(ctx, west); err != nil || members != 1 {
		t.Fatalf("the western session counts %d live members (%v)", members, err)
	}
	_, err = d.RecordInbox(ctx, east, "c", "m")
	check(err)
	n, _, err := d.DeleteInbox(ctx, west, time.Time{}, time.Now().Add(-time.Minute), 10)
	check(err)
	if n != 0 {
		t.Fatalf("cleanup deleted %d fresh rows", n)
	}
	n, _, err = d.DeleteInbox(ctx, west, time.Time{}, time.Now().Add(time.Minute), 10)
	check(err)
	if n != 1 {
		t.Fatalf("cleanup deleted %d old rows", n)
	}
}
