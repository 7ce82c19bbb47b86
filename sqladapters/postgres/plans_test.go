package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
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

// TestPlanPendingReadAfterSkipsDeletedRows drains rows the way a forwarder
// does and reads again before vacuum: a read from the head walks the
// entries of every deleted row still in the pending index, a read with
// PendingQuery.After starts past them. Both return the same rows; the
// buffers each touches tell the walks apart.
func TestPlanPendingReadAfterSkipsDeletedRows(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, time.Minute)
	b := planBuilderOf(t, d)
	const drained = 20000
	for _, s := range []string{
		`ALTER TABLE ` + d.OutboxTable() + ` SET (autovacuum_enabled = false)`,
		`INSERT INTO ` + d.OutboxTable() + ` (topic, uuid, payload, key_hash)
			SELECT 't', g::text, '\x', 0 FROM generate_series(1, ` + strconv.Itoa(drained+10) + `) g`,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var ids []int64
	if err := pool.QueryRow(ctx, `SELECT array_agg(id ORDER BY id) FROM `+d.OutboxTable()).Scan(&ids); err != nil {
		t.Fatal(err)
	}
	if n, err := d.CompleteForwarded(ctx, db, ids[:drained], false); err != nil || n != drained {
		t.Fatalf("CompleteForwarded: %d, %v", n, err)
	}
	head := sqladapters.PendingQuery{Limit: 10}
	after := sqladapters.PendingQuery{After: ids[drained-1], Limit: 10}
	for _, q := range []sqladapters.PendingQuery{head, after} {
		rows, err := d.ReadPending(ctx, db, q, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 10 || rows[0].ID != ids[drained] {
			t.Fatalf("read %+v: %d rows from id %v, want 10 from %d", q, len(rows), rows, ids[drained])
		}
	}
	blocks := func(q sqladapters.PendingQuery) int {
		t.Helper()
		var plan []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		text := planText(t, ctx, db, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)", b.SelectPending(q))
		if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan: %v\n%s", err, text)
		}
		return plan[0].Plan.Hit + plan[0].Plan.Read
	}
	fromHead, fromAfter := blocks(head), blocks(after)
	t.Logf("buffers: %d from the head, %d after the drained rows", fromHead, fromAfter)
	if fromHead < drained/1000 {
		t.Fatalf("the read from the head touched %d buffers: the drained rows' entries are gone, so the check cannot tell", fromHead)
	}
	if fromAfter*4 > fromHead {
		t.Fatalf("the read after the drained rows touched %d buffers, the read from the head %d: it walked them too", fromAfter, fromHead)
	}
}

// TestPlanOutboxInsertTakesTransactionIDFirst checks what PendingHorizon
// relies on: in the plan of the outbox insert, pg_current_xact_id() is a
// one-time filter of the node that draws the row ids (nextval), so the
// transaction has its id before any row id is drawn. A plain INSERT …
// VALUES draws the ids first and takes the transaction id when it writes
// the first row.
func TestPlanOutboxInsertTakesTransactionIDFirst(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	ctx := dialecttest.Ctx(t, time.Minute)
	for _, opts := range []postgres.Options{{}, {Notify: true}, {Partitioned: &postgres.PartitionOptions{}}} {
		d := pgtest.Dialect(t, db, pool, opts)
		msgs := []sqladapters.OutboxMessage{
			{Topic: "t", UUID: "a", Payload: []byte{}, Metadata: []byte("{}")},
			{Topic: "t", UUID: "b", Payload: []byte{}, Metadata: []byte("{}"), Key: "k", KeyHash: 1},
		}
		plan := planText(t, ctx, db, "EXPLAIN (VERBOSE)", planBuilderOf(t, d).InsertOutbox(msgs)[0])
		lines := strings.Split(plan, "\n")
		found := false
		for i, line := range lines {
			if strings.Contains(line, "One-Time Filter: (pg_current_xact_id() IS NOT NULL)") {
				// The filter's node is the one whose Output precedes it.
				found = i > 0 && strings.Contains(lines[i-1], "Output: nextval(")
				break
			}
		}
		if !found {
			t.Fatalf("options %+v: the insert does not take the transaction id before it draws row ids:\n%s", opts, plan)
		}
	}
}
