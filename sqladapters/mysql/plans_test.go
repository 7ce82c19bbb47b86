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
// The rows come in id order from the primary key, the outbox's only index,
// without a sort. The backoff check runs once per row read; if it scanned
// a table, reading a batch would cost batch × backlog. It must look the
// key hash up in the retry markers' primary key and their rows up in the
// outbox's, also while the markers' table is empty, as it is most of the
// time; with PendingQuery.DeadLetterHolds, the hold check looks the key hash up
// in the dead letters' hold_idx.
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
			{DeadLetterHolds: true, Limit: 2000},
			{DeadLetterHolds: true, Partitions: 16, Owned: []int{0, 1, 2}, After: 100, Limit: 2000},
		} {
			sel := read(q)
			plan := planRows(t, ctx, raw, "EXPLAIN "+sel.SQL, sel.Args...)
			want := 3
			if q.DeadLetterHolds {
				want = 4
			}
			if len(plan) != want {
				t.Fatalf("%s: plan has %d rows, want %d: %v\n%s", name, len(plan), want, plan, sel.SQL)
			}
			for _, r := range plan {
				index := "PRIMARY"
				if r["table"] == "h" {
					index = "hold_idx"
				}
				if r["type"] == "ALL" || r["key"] != index || regexp.MustCompile(`filesort|temporary`).MatchString(r["Extra"]) {
					t.Fatalf("%s: table %s: access %s via %q (%s), want the primary key\n%v\n%s", name, r["table"], r["type"], r["key"], r["Extra"], plan, sel.SQL)
				}
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

// TestPlanErrorGroupPageUsesIndex checks the plan of a page of one error
// group, as the admin page reads it for anyone who may view it: through
// the dead letters' fp_idx in id order, without sorting, whatever the
// other dead letters; never by walking every dead letter.
func TestPlanErrorGroupPageUsesIndex(t *testing.T) {
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, time.Minute)
	d := mysqltest.Dialect(t, raw, mysql.Options{})
	msgs := make([]sqladapters.OutboxMessage, 2000)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint("m", i), Payload: []byte("p"), Metadata: []byte("{}")}
	}
	if err := d.InsertOutbox(ctx, db, msgs); err != nil {
		t.Fatal(err)
	}
	dead := d.Tables()[5]
	for _, s := range []string{
		"INSERT INTO " + dead + " (id, topic, uuid, payload, metadata, `key`, key_hash, created_at, attempts, last_error, error_fp, dead_at)\n" +
			"SELECT id, topic, uuid, payload, metadata, `key`, key_hash, created_at, 3, CONCAT('bulk failure ', id % 100), " +
			"UNHEX(LEFT(SHA2(CONCAT('bulk failure ', id % 100), 256), 32)), created_at FROM " + d.OutboxTable(),
		`DELETE FROM ` + d.OutboxTable(),
		`ANALYZE TABLE ` + dead,
	} {
		if _, err := raw.ExecContext(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	fp := sqladapters.FingerprintError("bulk failure 7")
	if n, err := d.CountDeadLetters(ctx, db, sqladapters.DeadLetterFilter{Fingerprint: &fp}); err != nil || n != 20 {
		t.Fatalf("the group holds %d dead letters, %v; want 20", n, err)
	}
	sel := dialecttest.Builder(d).SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{Fingerprint: &fp}, AfterID: 10, Limit: 5})
	plan := planRows(t, ctx, raw, "EXPLAIN "+sel.SQL, sel.Args...)
	if len(plan) != 1 || plan[0]["key"] != "fp_idx" || plan[0]["type"] == "ALL" || regexp.MustCompile(`filesort|temporary`).MatchString(plan[0]["Extra"]) {
		t.Fatalf("the group page's plan: %v\n%s", plan, sel.SQL)
	}
}
