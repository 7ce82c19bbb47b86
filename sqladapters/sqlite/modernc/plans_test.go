package modernc_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestPlanPendingReadUsesIndexes checks the plan of the forwarder's read.
// The backoff check runs once per row read, so it must be an index search,
// not a scan; and the rows must come from the table's b-tree in id order,
// without a sort. The dead letters are in a table of their own: the read
// has none to walk over; with PendingQuery.DeadLetterHolds, the hold check
// searches their hold index.
func TestPlanPendingReadUsesIndexes(t *testing.T) {
	raw, err := modernc.Open(filepath.Join(t.TempDir(), "plans.db"), modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := sqlite.MustNew(sqlite.Options{})
	dialecttest.Migrate(t, db, d)
	msgs := make([]sqladapters.OutboxMessage, 3000)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{
			Topic: "t", UUID: fmt.Sprint("m", i), Payload: []byte{}, Metadata: []byte("{}"),
			Key: fmt.Sprint("k", i%3), KeyHash: int32(i % 3),
		}
	}
	if err := d.InsertOutbox(ctx, db, msgs); err != nil {
		t.Fatal(err)
	}
	for id := int64(1); id <= 2900; id += 100 {
		if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: id, Attempts: 3, Error: "x", Dead: true, Hold: id == 201}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}

	for name, read := range dialecttest.PendingReads(d) {
		for _, q := range []sqladapters.PendingQuery{
			{Limit: 2000},
			{Partitions: 16, Owned: []int{0, 1, 2}, Exclude: []int64{1, 2, 3}, Limit: 2000},
			{After: 1000, Limit: 2000},
			{DeadLetterHolds: true, Limit: 2000},
			{DeadLetterHolds: true, Partitions: 16, Owned: []int{0, 1, 2}, After: 1000, Limit: 2000},
		} {
			sel := read(q)
			rows, err := raw.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sel.SQL, sel.Args...)
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
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			plan := strings.Join(steps, "\n")
			if !strings.Contains(plan, "SEARCH p USING INDEX "+strings.Trim(d.OutboxTable(), `"`)+"_retry_idx") {
				t.Fatalf("%s: the backoff check does not search the retry index:\n%s\n%s", name, plan, sel.SQL)
			}
			if q.DeadLetterHolds && !strings.Contains(plan, "SEARCH h USING INDEX "+strings.Trim(d.OutboxTable(), `"`)+"_deadhold_idx") {
				t.Fatalf("%s: the hold check does not search the hold index:\n%s\n%s", name, plan, sel.SQL)
			}
			for _, s := range steps {
				if strings.HasPrefix(s, "SCAN p") || strings.HasPrefix(s, "SCAN h") || strings.Contains(s, "USE TEMP B-TREE") ||
					strings.HasPrefix(s, "SEARCH o") && !strings.Contains(s, "INTEGER PRIMARY KEY") ||
					strings.HasPrefix(s, "SCAN o") && strings.Contains(s, "INDEX") {
					t.Fatalf("%s: plan step %q scans the outbox for the check, sorts, or reads rows through an index:\n%s", name, s, plan)
				}
			}
		}
	}
}

// TestPlanErrorGroupPageUsesIndex checks the plan of a page of one error
// group: through the fingerprint index in id order, never a scan of the
// dead letters or a sort.
func TestPlanErrorGroupPageUsesIndex(t *testing.T) {
	raw, err := modernc.Open(filepath.Join(t.TempDir(), "plans.db"), modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := sqlite.MustNew(sqlite.Options{})
	dialecttest.Migrate(t, db, d)
	msgs := make([]sqladapters.OutboxMessage, 2000)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint("m", i), Payload: []byte("p"), Metadata: []byte("{}")}
	}
	if err := d.InsertOutbox(ctx, db, msgs); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= len(msgs); id++ {
		if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: int64(id), Attempts: 3, Error: fmt.Sprint("bulk failure ", id%100), Dead: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	fp := sqladapters.FingerprintError("bulk failure 7")
	sel := dialecttest.Builder(d).SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{Fingerprint: &fp}, AfterID: 10, Limit: 5})
	rows, err := raw.QueryContext(ctx, "EXPLAIN QUERY PLAN "+sel.SQL, sel.Args...)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var steps []string
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	plan := strings.Join(steps, "\n")
	if len(steps) != 1 || !strings.Contains(plan, "_deadfp_idx (error_fp=? AND id>?)") {
		t.Fatalf("the group page's plan is not a search of the fingerprint index:\n%s\n%s", plan, sel.SQL)
	}
}
