package postgres_test

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// planBuilder is the part of the Postgres SQL builder whose plans these
// tests read: the store's statements, the pending read's variant with
// ages, its backlog settings, and the operations' statements that find
// rows by id.
type planBuilder interface {
	sqlstore.Builder
	sqlstore.PendingAges
	sqlstore.PendingReadSetup
	DeleteDeadLetters(ids []int64) sqladapters.Query
	SelectDeadLetterIDs(w ops.Where, afterID int64, limit int) sqladapters.Query
	SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query
}

// planBuilderOf returns the SQL builder behind d.
func planBuilderOf(t *testing.T, d sqladapters.Dialect) planBuilder {
	t.Helper()
	b, ok := sqlstore.BuilderOf(d)
	if !ok {
		t.Fatal("the dialect has no SQL builder")
	}
	pb, ok := b.(planBuilder)
	if !ok {
		t.Fatalf("the Postgres builder %T lacks a statement the plan tests read", b)
	}
	return pb
}

// planText runs explain (an EXPLAIN command) of q on e and returns the plan, one line per row.
func planText(t *testing.T, ctx context.Context, e sqladapters.Executor, explain string, q sqladapters.Query) string {
	t.Helper()
	rows, err := e.Query(ctx, explain+" "+q.SQL, q.Args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", explain, err, q.SQL)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var line []byte
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, string(line))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(plan) == 0 {
		t.Fatalf("%s returned no plan\n%s", explain, q.SQL)
	}
	return strings.Join(plan, "\n")
}

// TestPlanPartitionedStatementsUseIndexes checks that every statement that
// finds outbox rows by id, or reads pending ones, runs on an index of each
// partition of the time-partitioned outbox: with sequential scans turned
// off, none is left in any plan.
func TestPlanPartitionedStatementsUseIndexes(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := pgtest.Dialect(t, db, pool, postgres.Options{Partitioned: &postgres.PartitionOptions{}})
	b := planBuilderOf(t, d)

	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	if _, err := tx.Exec(ctx, `SET LOCAL enable_seqscan = off`); err != nil {
		t.Fatal(err)
	}
	pending := sqladapters.PendingQuery{Partitions: 8, Owned: []int{1, 2}, Limit: 100}
	for name, q := range map[string]sqladapters.Query{
		"SelectPending":        b.SelectPending(pending),
		"SelectPendingWithAge": b.SelectPendingWithAge(pending),
		"CompleteForwarded":    b.CompleteForwarded([]int64{1, 2, 3}, false),
		"CompleteKept":         b.CompleteForwarded([]int64{1, 2, 3}, true),
		"RecordFailure":        b.RecordFailure(sqladapters.Failure{ID: 7, Attempts: 1, Error: "x"}),
		"RequeueDeadLetters":   b.RequeueDeadLetters([]int64{4}),
		"ListDeadLetters":      b.ListDeadLetters(0, 10),
		"DeleteDeadLetters":    b.DeleteDeadLetters([]int64{4}),
		"SelectDeadLetterIDs":  b.SelectDeadLetterIDs(ops.Where{IDs: []int64{4, 5}}, 0, 100),
		"SelectForwardedIDs":   b.SelectForwardedIDs(time.Now(), 0, 100),
	} {
		if plan := planText(t, ctx, tx, "EXPLAIN", q); strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s scans a partition without an index:\n%s", name, plan)
		}
	}
}

// TestPlanPendingReadWithoutJIT runs the forwarder's read the way the
// forwarder does while draining a backlog, with JIT forced on every plan
// (jit_above_cost 0): the builder's backlog settings must keep JIT out of
// it. A backlog of tens of thousands of rows crosses the default
// threshold, and compiling the plan then costs far more than running it.
func TestPlanPendingReadWithoutJIT(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, time.Minute)
	b := planBuilderOf(t, d)
	msgs := make([]sqladapters.OutboxMessage, 100)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{
			Topic: "t", UUID: strconv.Itoa(i), Payload: []byte{}, Metadata: []byte("{}"),
			Key: "k" + strconv.Itoa(i%3), KeyHash: int32(i % 3),
		}
	}
	if err := d.InsertOutbox(ctx, db, msgs); err != nil {
		t.Fatal(err)
	}
	var jitAvailable bool
	if err := pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&jitAvailable); err != nil {
		t.Fatal(err)
	}
	usesJIT := func(setup bool, sel sqladapters.Query) bool {
		t.Helper()
		tx, err := db.Begin(ctx, sql.TxOptions{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer sqladapters.Rollback(tx)
		stmts := []sqladapters.Query{{SQL: `SET LOCAL jit = on`}, {SQL: `SET LOCAL jit_above_cost = 0`}}
		if setup {
			stmts = append(stmts, b.PendingReadSetup()...)
		}
		for _, s := range stmts {
			if _, err := s.Exec(ctx, tx); err != nil {
				t.Fatalf("%s: %v", s.SQL, err)
			}
		}
		return strings.Contains(planText(t, ctx, tx, "EXPLAIN (ANALYZE, FORMAT JSON)", sel), `"JIT"`)
	}
	for _, q := range []sqladapters.PendingQuery{
		{Limit: 2000},
		{Partitions: 16, Owned: []int{0, 1, 2}, Limit: 2000},
	} {
		for name, sel := range map[string]sqladapters.Query{
			"SelectPending":        b.SelectPending(q),
			"SelectPendingWithAge": b.SelectPendingWithAge(q),
		} {
			if usesJIT(true, sel) {
				t.Fatalf("%s with the backlog settings was JIT-compiled (owned %v)", name, q.Owned)
			}
			// Without the settings the same read is compiled, so the
			// check above can tell.
			if jitAvailable && !usesJIT(false, sel) {
				t.Fatalf("control: %s without the backlog settings was not JIT-compiled (owned %v)", name, q.Owned)
			}
		}
	}
	if !jitAvailable {
		t.Log("the server has no JIT provider; only the settings' statements were checked")
	}
}
