package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/mysqltest"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestPlanPendingReadUsesIndexes checks the plan of the forwarder's read.
// The backoff check runs once per row read; if it scanned the table,
// reading a batch would cost batch × backlog. The plan must use state_idx
// for the rows and retry_idx for the check, with statistics that see
// retry_hash as almost all NULL; and an instance owning some partitions
// must test each row's partition in the index, not in the row.
func TestPlanPendingReadUsesIndexes(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := mysqltest.Dialect(t, raw, mysql.Options{})
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
	if _, err := raw.ExecContext(ctx, `ANALYZE TABLE `+d.OutboxTable()); err != nil {
		t.Fatal(err)
	}
	for name, read := range dialecttest.PendingReads(d) {
		for _, q := range []sqladapters.PendingQuery{
			{Limit: 2000},
			{Partitions: 16, Owned: []int{0, 1, 2}, Exclude: []int64{1, 2, 3}, Limit: 2000},
		} {
			sel := read(q)
			plan := planRows(t, ctx, raw, "EXPLAIN "+sel.SQL, sel.Args...)
			if len(plan) != 2 {
				t.Fatalf("%s: plan has %d rows, want 2: %v\n%s", name, len(plan), plan, sel.SQL)
			}
			for _, r := range plan {
				want := map[string]string{"o": "state_idx", "p": "retry_idx"}[r["table"]]
				if r["type"] == "ALL" || r["key"] != want {
					t.Fatalf("%s: table %s: access %s via %q, want index %s\n%v\n%s", name, r["table"], r["type"], r["key"], want, plan, sel.SQL)
				}
			}
			if q.Owned == nil {
				continue
			}
			var js string
			if err := raw.QueryRowContext(ctx, "EXPLAIN FORMAT=JSON "+sel.SQL, sel.Args...).Scan(&js); err != nil {
				t.Fatal(err)
			}
			if !regexp.MustCompile(`"index_condition":\s*"[^"]*key_hash`).MatchString(js) {
				t.Fatalf("%s: the partition test is not pushed into state_idx:\n%s", name, js)
			}
		}
	}
}

// planRows runs an EXPLAIN statement and returns its rows as one column
// map per row.
func planRows(t *testing.T, ctx context.Context, db *sql.DB, explain string, args ...any) []map[string]string {
	t.Helper()
	rows, err := db.QueryContext(ctx, explain, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, explain)
	}
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
