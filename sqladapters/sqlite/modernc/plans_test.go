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
// not a scan; and with most rows dead the rows must come from the pending
// index in id order, not from a walk over the dead ones.
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
	if _, err := raw.ExecContext(ctx, `UPDATE `+d.OutboxTable()+` SET dead_at = '2026-01-01T00:00:00.000Z' WHERE id <= 2900`); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}

	for name, read := range dialecttest.PendingReads(d) {
		for _, q := range []sqladapters.PendingQuery{
			{Limit: 2000},
			{Partitions: 16, Owned: []int{0, 1, 2}, Exclude: []int64{1, 2, 3}, Limit: 2000},
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
			if !strings.Contains(plan, "_pending_idx") || !strings.Contains(plan, "_retry_idx") {
				t.Fatalf("%s: plan does not read through the pending and retry indexes:\n%s\n%s", name, plan, sel.SQL)
			}
			for _, s := range steps {
				if s == "SCAN o" || strings.HasPrefix(s, "SCAN p") || strings.Contains(s, "USE TEMP B-TREE") {
					t.Fatalf("%s: plan step %q scans the outbox or sorts:\n%s", name, s, plan)
				}
			}
		}
	}
}
