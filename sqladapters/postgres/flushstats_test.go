package postgres_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestFlushStatsSQL checks that with Options.FlushStats every statement
// of an insert, into the outbox and into the scheduled table, asks for
// the report, and that none does without it.
func TestFlushStatsSQL(t *testing.T) {
	msgs := make([]sqladapters.OutboxMessage, 12001)
	for _, flush := range []bool{false, true} {
		for _, opts := range []postgres.Options{{FlushStats: flush}, {FlushStats: flush, Notify: true}, {FlushStats: flush, Partitioned: &postgres.PartitionOptions{}}} {
			b := dialecttest.Builder(postgres.MustNew(opts))
			qs := append(b.InsertOutbox(msgs), b.InsertScheduled(msgs)...)
			if len(qs) < 4 {
				t.Fatalf("%d statements, want several of each", len(qs))
			}
			for i, q := range qs {
				if n := strings.Count(q.SQL, "pg_stat_force_next_flush()"); n != map[bool]int{true: 1, false: 0}[flush] {
					t.Fatalf("FlushStats=%v: statement %d calls pg_stat_force_next_flush %d times:\n%.300s", flush, i, n, q.SQL)
				}
			}
		}
	}
}

// TestFlushStatsReportsAtCommit checks what a fleet's stat doorbell
// relies on: once a transaction that published with FlushStats has
// committed, another session reads its inserts in the statistics, even
// though the writing session reported less than a second before (without
// the option, they would wait until that session idled for 10 s). The
// table's own counter is read, so other tests writing into the database
// cannot make up for a missing report.
func TestFlushStatsReportsAtCommit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{FlushStats: true, WithoutInbox: true})
	var version int
	if err := pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version < 150000 {
		t.Skipf("pg_stat_force_next_flush needs PostgreSQL 15 (server %d)", version)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	writer := pgxv5.WrapConn(conn.Conn())
	inserted := func() int64 {
		t.Helper()
		var n int64
		if err := pool.QueryRow(ctx, `SELECT pg_stat_get_tuples_inserted($1::regclass)`, d.OutboxTable()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	publish := func(n int) {
		t.Helper()
		tx, err := writer.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		msgs := make([]sqladapters.OutboxMessage, n)
		for i := range msgs {
			msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: dialecttest.UniqueName("u"), Payload: []byte("p"), Metadata: []byte("{}")}
		}
		if err := d.InsertOutbox(ctx, tx, msgs); err != nil {
			_ = tx.Rollback(ctx)
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The session reports after the first transaction (or holds it back
	// if it reported within the second); the second follows at once.
	publish(1)
	publish(3)
	if n := inserted(); n != 4 {
		t.Fatalf("the statistics count %d inserts into the outbox once both transactions committed, want 4", n)
	}
}
