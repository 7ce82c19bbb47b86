package integration_test

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestPostgresPendingReadExcludes checks that the pending read leaves out
// the ids it is given (the rows a forwarder holds), with and without owned
// partitions, in both layouts, and under the generic plan a prepared
// statement settles on as well as a custom one.
func TestPostgresPendingReadExcludes(t *testing.T) {
	for _, layout := range []struct {
		name string
		opts postgres.Options
	}{
		{"Plain", postgres.Options{}},
		{"Partitioned", postgres.Options{Partitioned: &postgres.PartitionOptions{}}},
	} {
		t.Run(layout.name, func(t *testing.T) {
			pool := testenv.Postgres(t)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(t, db, pool, layout.opts)
			ctx := testenv.Ctx(t, time.Minute)
			var msgs []sqladapters.OutboxMessage
			for i := range 8 {
				msgs = append(msgs, sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i), KeyHash: int32(i)})
			}
			ids := (&dialectOps{t: t, ctx: ctx, db: db, d: d}).insert(msgs...)
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				read := func(q sqladapters.PendingQuery) string {
					t.Helper()
					tx, err := db.Begin(ctx, sql.TxOptions{ReadOnly: true})
					if err != nil {
						t.Fatal(err)
					}
					defer sqladapters.Rollback(tx)
					if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = `+mode); err != nil {
						t.Fatal(err)
					}
					rows, err := d.ReadPending(ctx, tx, q, false)
					if err != nil {
						t.Fatal(err)
					}
					got := ""
					for _, r := range rows {
						got += " " + r.UUID
					}
					return got
				}
				// Several runs, so that a cached statement reaches the
				// plan it would settle on.
				for range 7 {
					if got := read(sqladapters.PendingQuery{Exclude: []int64{ids[0], ids[5]}, Limit: 3}); got != " m1 m2 m3" {
						t.Fatalf("%s: excluded m0, m5, limit 3: read%s", mode, got)
					}
					if got := read(sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, Exclude: []int64{ids[1], ids[2]}, Limit: 100}); got != " m3 m5 m7" {
						t.Fatalf("%s: partitions 1, 3, excluded m1, m2: read%s", mode, got)
					}
					if got := read(sqladapters.PendingQuery{Exclude: ids, Limit: 100}); got != "" {
						t.Fatalf("%s: all excluded: read%s", mode, got)
					}
				}
			}
		})
	}
}
