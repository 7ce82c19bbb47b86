package postgres_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// planBuilder is the Postgres SQL builder whose plans these tests read,
// with the pending read's variant with ages, which the forwarder runs.
type planBuilder struct{ sqlstore.Builder }

// SelectPendingWithAge returns the pending read with ages.
func (b planBuilder) SelectPendingWithAge(q sqladapters.PendingQuery) sqladapters.Query {
	s, _ := b.Builder.SelectPendingWithAge(q)
	return s
}

// planBuilderOf returns the SQL builder behind d.
func planBuilderOf(t *testing.T, d sqladapters.Dialect) planBuilder {
	t.Helper()
	b, ok := sqlstore.BuilderOf(d)
	if !ok {
		t.Fatal("the dialect has no SQL builder")
	}
	if _, ok := b.SelectPendingWithAge(sqladapters.PendingQuery{}); !ok || len(b.PendingReadSetup()) == 0 {
		t.Fatalf("the Postgres builder %T declares no pending read with ages or no backlog settings", b)
	}
	return planBuilder{b}
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
	fp := sqladapters.FingerprintError("e")
	for name, qs := range map[string][]sqladapters.Query{
		"SelectPending":        {b.SelectPending(pending)},
		"SelectPendingWithAge": {b.SelectPendingWithAge(pending)},
		"SelectPendingHeld":    {b.SelectPending(sqladapters.PendingQuery{DeadLetterHolds: true, Partitions: 8, Owned: []int{1, 2}, Limit: 100})},
		"CompleteForwarded":    b.CompleteForwarded([]int64{1, 2, 3}, false),
		"CompleteKept":         b.CompleteForwarded([]int64{1, 2, 3}, true),
		"RecordFailure":        b.RecordFailure(sqladapters.Failure{ID: 7, Attempts: 1, Error: "x"}),
		"RecordFailureDead":    b.RecordFailure(sqladapters.Failure{ID: 7, Attempts: 1, Error: "x", Dead: true}),
		"RequeueDeadLetters":   b.RequeueDeadLetters([]int64{4}),
		"SelectDeadLetters":    {b.SelectDeadLetters(sqladapters.DeadLetterQuery{Limit: 10})},
		"SelectErrorGroup":     {b.SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{Fingerprint: &fp}, Limit: 10})},
		"DeleteDeadLetters":    {b.DeleteDeadLetters([]int64{4})},
		"SelectDeadLetterIDs":  {b.SelectDeadLetterIDs(sqladapters.DeadLetterFilter{IDs: []int64{4, 5}}, 0, 100)},
		"SelectForwardedIDs":   {b.SelectForwardedIDs(time.Now(), 0, 100)},
		"DeleteForwarded":      {b.DeleteForwarded([]int64{4})},
	} {
		for _, q := range qs {
			if plan := planText(t, ctx, tx, "EXPLAIN", q); strings.Contains(plan, "Seq Scan") {
				t.Errorf("%s scans a partition without an index:\n%s", name, plan)
			}
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

// TestMoveDueTakesTransactionIDOnlyToMove checks that the move of due
// scheduled messages, which every forwarder instance runs at least once a
// PollInterval, takes no transaction id (and so writes no commit record)
// when nothing is due, and that it has taken one once it moved a row.
func TestMoveDueTakesTransactionIDOnlyToMove(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	later := sqladapters.OutboxMessage{Topic: "t", UUID: "a", Payload: []byte{}, Metadata: []byte("{}"), DueAt: time.Now().Add(time.Hour)}
	if err := d.InsertOutbox(ctx, db, []sqladapters.OutboxMessage{later}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		now  time.Time
		want bool
	}{{time.Now(), false}, {time.Now().Add(2 * time.Hour), true}} {
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		moved, _, err := d.MoveDue(ctx, tx, c.now, 10)
		if err != nil {
			t.Fatal(err)
		}
		var assigned bool
		rows, err := tx.Query(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			if err := rows.Scan(&assigned); err != nil {
				t.Fatal(err)
			}
		}
		rows.Close()
		sqladapters.Rollback(tx)
		if assigned != c.want || (moved > 0) != c.want {
			t.Fatalf("move at %v: %d moved, transaction id taken %v; want %v", c.now, moved, assigned, c.want)
		}
	}
}

// TestPlanErrorGroupPageReadsOneGroup reads a page of one error group
// among 1,000,000 dead letters, as the admin page does for anyone who may
// view it: the page must come from the fingerprint index, in id order,
// without a payload or metadata in its output, and touch a page's worth
// of buffers. The substring search of the same error, which reads every
// dead row, is the yardstick; the plan is checked as a custom and as a
// generic plan (a prepared statement's).
func TestPlanErrorGroupPageReadsOneGroup(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, 5*time.Minute)
	b := planBuilderOf(t, d)
	const rows, groups = 1000000, 100
	dead := d.Tables()[5]
	for _, s := range []string{
		`INSERT INTO ` + dead + ` (id, topic, uuid, payload, metadata, key_hash, created_at, attempts, last_error, error_fp, dead_at)
			SELECT g, 'bulk', g::text, convert_to(repeat('p', 64), 'UTF8'), '{}', 0, now(), 3, e, substring(sha256(convert_to(e, 'UTF8')) from 1 for 16), now()
			FROM generate_series(1, ` + strconv.Itoa(rows) + `) g, LATERAL (SELECT 'bulk failure ' || (g % ` + strconv.Itoa(groups) + `) AS e) x`,
		`ANALYZE ` + dead,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	fp := sqladapters.FingerprintError("bulk failure 7")
	if n, err := d.CountDeadLetters(ctx, db, sqladapters.DeadLetterFilter{Fingerprint: &fp}); err != nil || n != rows/groups {
		t.Fatalf("the group holds %d dead letters, %v; want %d", n, err, rows/groups)
	}
	page := b.SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{Fingerprint: &fp}, AfterID: 5000, Limit: 50})
	search := b.SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{ErrorContains: "bulk failure 7x"}, Limit: 50})

	type node struct {
		Type    string   `json:"Node Type"`
		Index   string   `json:"Index Name"`
		Output  []string `json:"Output"`
		Hit     int      `json:"Shared Hit Blocks"`
		Read    int      `json:"Shared Read Blocks"`
		Rows    int      `json:"Actual Rows"`
		Plans   []node   `json:"Plans"`
		Sort    []string `json:"Sort Key"`
		Filters string   `json:"Filter"`
	}
	explain := func(mode string, q sqladapters.Query) node {
		t.Helper()
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer sqladapters.Rollback(tx)
		if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		var plan []struct{ Plan node }
		text := planText(t, ctx, tx, "EXPLAIN (ANALYZE, BUFFERS, VERBOSE, FORMAT JSON)", q)
		if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan: %v\n%s", err, text)
		}
		return plan[0].Plan
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		top := explain(mode, page)
		if top.Type != "Limit" || len(top.Plans) != 1 {
			t.Fatalf("%s: the page's plan is not a limit over one scan: %+v", mode, top)
		}
		scan := top.Plans[0]
		if scan.Type != "Index Scan" || !strings.HasSuffix(scan.Index, "_deadfp_idx") || len(scan.Plans) != 0 {
			t.Fatalf("%s: the page is read by %s on %q, want an index scan of the fingerprint index: %+v", mode, scan.Type, scan.Index, scan)
		}
		for _, col := range scan.Output {
			if strings.Contains(col, "payload") || strings.Contains(col, "metadata") {
				t.Fatalf("%s: the page reads %s: %v", mode, col, scan.Output)
			}
		}
		whole := explain(mode, search)
		t.Logf("%s: the group page touched %d buffers for %d rows; the search through every dead row %d", mode, top.Hit+top.Read, top.Rows, whole.Hit+whole.Read)
		if top.Rows != 50 || (top.Hit+top.Read)*100 > whole.Hit+whole.Read {
			t.Fatalf("%s: the group page read %d rows through %d buffers, the search through every dead row %d: it did not read one group", mode, top.Rows, top.Hit+top.Read, whole.Hit+whole.Read)
		}
	}
}

// TestPlanPendingReadThroughPrimaryKey reads pending rows, as the
// forwarder does, from an outbox of MILLBOX_PLAN_ROWS pending rows
// (default 1,000,000; the plan shown in the docs was read at 10,000,000)
// next to as many dead letters and kept rows in their tables, and one row
// waiting for a retry that holds its key back: the outbox has no index
// but its primary key and the partial retry index, and the read is an
// index scan of the primary key that stops after its limit, touching a
// page's worth of buffers whatever the table's size, with the backoff
// check a lookup in the retry index. Read from the head, after a floor
// (PendingQuery.After) and for some partitions, as custom and as generic
// plans; and with PendingQuery.DeadLetterHolds, next to a dead letter that holds
// its key among the million that do not, where the hold check is a lookup
// in the dead letters' hold index.
func TestPlanPendingReadThroughPrimaryKey(t *testing.T) {
	rows := 1000000
	if v := os.Getenv("MILLBOX_PLAN_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10000 {
			t.Fatalf("MILLBOX_PLAN_ROWS=%q: want a number of at least 10000", v)
		}
		rows = n
	}
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, 30*time.Minute)
	b := planBuilderOf(t, d)
	n := strconv.Itoa(rows)
	for _, s := range []string{
		`INSERT INTO ` + d.OutboxTable() + ` (topic, uuid, payload, key, key_hash)
			SELECT 'bulk', g::text, convert_to(repeat('p', 64), 'UTF8'), 'k' || (g % 1000), g % 1000 FROM generate_series(1, ` + n + `) g`,
		`INSERT INTO ` + d.Tables()[5] + ` (id, topic, uuid, payload, metadata, key_hash, created_at, attempts, last_error, dead_at)
			SELECT -g, 'bulk', g::text, convert_to(repeat('p', 64), 'UTF8'), '{}', 0, now(), 3, 'dead', now() FROM generate_series(1, ` + n + `) g`,
		`INSERT INTO ` + d.Tables()[6] + ` (id, topic, uuid, payload, metadata, key_hash, created_at, published_at)
			SELECT -g, 'bulk', g::text, convert_to(repeat('p', 64), 'UTF8'), '{}', 0, now(), now() FROM generate_series(1, ` + n + `) g`,
		`ANALYZE ` + d.OutboxTable(),
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	var indexes []string
	if err := pool.QueryRow(ctx, `SELECT array_agg(indexrelid::regclass::text ORDER BY 1) FROM pg_index WHERE indrelid = $1::regclass`, d.OutboxTable()).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if len(indexes) != 2 || !strings.HasSuffix(indexes[0], `_pkey"`) && !strings.HasSuffix(indexes[0], "_pkey") || !strings.Contains(indexes[1], "_retry_idx") {
		t.Fatalf("the outbox's indexes: %v, want its primary key and the partial retry index", indexes)
	}
	// The first row of key k7 waits for a retry: it holds its key back.
	if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: 7, Attempts: 1, Error: "x", Backoff: time.Hour}); err != nil {
		t.Fatal(err)
	}
	// The first row of key k8 is a dead letter that holds its key.
	if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: 8, Attempts: 3, Error: "x", Dead: true, Hold: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE `+d.Tables()[5]); err != nil {
		t.Fatal(err)
	}

	type node struct {
		Type     string   `json:"Node Type"`
		Relation string   `json:"Relation Name"`
		Index    string   `json:"Index Name"`
		Hit      int      `json:"Shared Hit Blocks"`
		Read     int      `json:"Shared Read Blocks"`
		Rows     int      `json:"Actual Rows"`
		Plans    []node   `json:"Plans"`
		Sort     []string `json:"Sort Key"`
	}
	const limit = 100
	for name, q := range map[string]sqladapters.PendingQuery{
		"head":       {Limit: limit},
		"after":      {After: int64(rows / 2), Limit: limit},
		"partitions": {Partitions: 16, Owned: []int{3, 11}, After: int64(rows / 2), Limit: limit},
		"held":       {DeadLetterHolds: true, Limit: limit},
		"held after": {DeadLetterHolds: true, Partitions: 16, Owned: []int{3, 8}, After: int64(rows / 2), Limit: limit},
	} {
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			tx, err := db.Begin(ctx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
				t.Fatal(err)
			}
			text := planText(t, ctx, tx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)", b.SelectPendingWithAge(q))
			sqladapters.Rollback(tx)
			var plan []struct{ Plan node }
			if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
				t.Fatalf("plan: %v\n%s", err, text)
			}
			top := plan[0].Plan
			if top.Type != "Limit" || len(top.Plans) != 1 || top.Rows != limit {
				t.Fatalf("%s, %s: not a limit of %d rows over one scan: %s", name, mode, limit, text)
			}
			scan := top.Plans[0]
			if scan.Type != "Index Scan" || !strings.HasSuffix(scan.Index, "_pkey") || len(scan.Sort) != 0 {
				t.Fatalf("%s, %s: the rows come from %s %q, want an index scan of the primary key: %s", name, mode, scan.Type, scan.Index, text)
			}
			var uses func(n node, index string) bool
			uses = func(n node, index string) bool {
				if n.Relation != "" && n.Index != "" && strings.HasSuffix(n.Index, index) {
					return true
				}
				for _, c := range n.Plans {
					if uses(c, index) {
						return true
					}
				}
				return false
			}
			if !uses(scan, "_retry_idx") {
				t.Fatalf("%s, %s: the backoff check does not look the key up in the retry index: %s", name, mode, text)
			}
			if q.DeadLetterHolds && !uses(scan, "_deadhold_idx") {
				t.Fatalf("%s, %s: the hold check does not look the key up in the dead letters' hold index: %s", name, mode, text)
			}
			buffers := top.Hit + top.Read
			t.Logf("%s, %s: %d rows of %d pending through %s, %d buffers", name, mode, top.Rows, rows, scan.Index, buffers)
			if buffers > 10*limit {
				t.Fatalf("%s, %s: the read touched %d buffers for %d rows: it walked the table", name, mode, buffers, limit)
			}
			if name == "head" && mode == "force_generic_plan" {
				t.Logf("the plan:\n%s", planText(t, ctx, db, "EXPLAIN (COSTS OFF)", b.SelectPendingWithAge(q)))
			}
		}
	}
}

// TestPlanPendingReadIgnoresScheduledRows fills the table of scheduled
// messages with a million rows (MILLBOX_PLAN_ROWS) next to a small
// outbox: the pending read still takes a bounded walk of the outbox's
// primary key and never looks at them, and the move of the due ones and
// the next due time read the due-time index, not the table.
func TestPlanPendingReadIgnoresScheduledRows(t *testing.T) {
	rows := 1000000
	if v := os.Getenv("MILLBOX_PLAN_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 10000 {
			t.Fatalf("MILLBOX_PLAN_ROWS=%q: want a number of at least 10000", v)
		}
		rows = n
	}
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, 30*time.Minute)
	b := planBuilderOf(t, d)
	scheduled := d.Tables()[7]
	const pending, due = 1000, 100
	for _, s := range []string{
		`INSERT INTO ` + d.OutboxTable() + ` (topic, uuid, payload, key, key_hash)
			SELECT 'bulk', g::text, convert_to(repeat('p', 64), 'UTF8'), 'k' || (g % 100), g % 100 FROM generate_series(1, ` + strconv.Itoa(pending) + `) g`,
		// The first rows are due, the others one a minute from now on.
		`INSERT INTO ` + scheduled + ` (topic, uuid, payload, key, key_hash, due_at)
			SELECT 'later', g::text, convert_to(repeat('p', 64), 'UTF8'), 'k' || (g % 1000), g % 1000, now() + (g - ` + strconv.Itoa(due) + `) * interval '1 minute' - interval '30 seconds'
			FROM generate_series(1, ` + strconv.Itoa(rows) + `) g`,
		`ANALYZE ` + d.OutboxTable(),
		`ANALYZE ` + scheduled,
	} {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	type node struct {
		Type     string `json:"Node Type"`
		Relation string `json:"Relation Name"`
		Index    string `json:"Index Name"`
		Hit      int    `json:"Shared Hit Blocks"`
		Read     int    `json:"Shared Read Blocks"`
		Rows     int    `json:"Actual Rows"`
		Plans    []node `json:"Plans"`
	}
	explain := func(q sqladapters.Query) (node, string) {
		t.Helper()
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// The move deletes what it moves: measure it and roll it back.
		defer sqladapters.Rollback(tx)
		text := planText(t, ctx, tx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)", q)
		var plan []struct{ Plan node }
		if err := json.Unmarshal([]byte(text), &plan); err != nil || len(plan) != 1 {
			t.Fatalf("plan: %v\n%s", err, text)
		}
		return plan[0].Plan, text
	}
	var walk func(n node, visit func(node))
	walk = func(n node, visit func(node)) {
		visit(n)
		for _, c := range n.Plans {
			walk(c, visit)
		}
	}

	const limit = 100
	top, text := explain(b.SelectPendingWithAge(sqladapters.PendingQuery{Limit: limit}))
	if top.Type != "Limit" || len(top.Plans) != 1 || top.Rows != limit {
		t.Fatalf("the pending read is not a limit of %d rows over one scan: %s", limit, text)
	}
	if scan := top.Plans[0]; scan.Type != "Index Scan" || !strings.HasSuffix(scan.Index, "_pkey") {
		t.Fatalf("the pending rows come from %s %q, want an index scan of the outbox's primary key: %s", scan.Type, scan.Index, text)
	}
	walk(top, func(n node) {
		if strings.Contains(n.Relation, "_scheduled") || strings.Contains(n.Index, "_sched") {
			t.Fatalf("the pending read reads the scheduled messages: %s", text)
		}
	})
	if buffers := top.Hit + top.Read; buffers > 10*limit {
		t.Fatalf("the pending read touched %d buffers for %d rows", buffers, limit)
	}

	for name, q := range map[string]sqladapters.Query{
		"MoveDue": b.MoveDue(time.Now(), 1000).Move(nil)[0],
		"NextDue": b.NextDue(),
	} {
		top, text := explain(q)
		walk(top, func(n node) {
			if n.Type == "Seq Scan" || n.Type == "Bitmap Heap Scan" && strings.Contains(n.Relation, "_scheduled") {
				t.Fatalf("%s scans %s: %s", name, n.Relation, text)
			}
		})
		buffers := top.Hit + top.Read
		t.Logf("%s: %d buffers with %d scheduled rows", name, buffers, rows)
		if buffers > 50*due {
			t.Fatalf("%s touched %d buffers: it walked the scheduled rows", name, buffers)
		}
	}
	moved, _, err := d.MoveDue(ctx, db, time.Now(), 1000)
	if err != nil || moved != due {
		t.Fatalf("moved %d, %v; want the %d due rows", moved, err, due)
	}
}
