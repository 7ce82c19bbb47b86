package integration_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
)

// statementCounter counts the statements run through Exec or Query.
type statementCounter struct {
	sqladapters.DB
	n atomic.Int64
}

func (c *statementCounter) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	c.n.Add(1)
	return c.DB.Exec(ctx, q, args...)
}

func (c *statementCounter) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	c.n.Add(1)
	return c.DB.Query(ctx, q, args...)
}

// TestPostgresInboxCleanerBatches deletes old rows in bounded batches, on
// the Postgres dialect's range deletes (each batch starting where the last
// ended). Many rows share one received_at
// across batch boundaries, so a batch that started after its predecessor's
// last row instead of at it would leave some behind.
func TestPostgresInboxCleanerBatches(t *testing.T) {
	t.Parallel()
	env := pgEnv(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		wrap func(sqladapters.Dialect) sqladapters.Dialect
	}{
		{"RangeDeletes", func(d sqladapters.Dialect) sqladapters.Dialect { return d }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := env.NewDialect(t)
			now := time.Now()
			insert := func(prefix string, n int, at time.Time) {
				t.Helper()
				_, err := env.DB.Exec(ctx, `INSERT INTO `+d.InboxTable()+` (consumer, message_id, received_at)
SELECT 'billing', $1 || g, $2 FROM generate_series(1, $3::int) g`, prefix, at, n)
				if err != nil {
					t.Fatal(err)
				}
			}
			insert("oldest-", 7, now.Add(-4*time.Hour))
			insert("tied-", 25, now.Add(-3*time.Hour)) // one received_at over three batches
			for i := range 5 {
				insert("old-"+string(rune('a'+i))+"-", 1, now.Add(-2*time.Hour+time.Duration(i)*time.Second))
			}
			insert("recent-", 5, now.Add(-10*time.Minute))
			db := &statementCounter{DB: env.DB}
			cl, err := inbox.NewCleaner(inbox.CleanerConfig{DB: db, Dialect: c.wrap(d), Retention: time.Hour, BatchSize: 10, Logger: testenv.Logger(t)})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := cl.CleanOnce(ctx); err != nil || n != 37 {
				t.Fatalf("deleted %d, %v; want the 37 old rows", n, err)
			}
			if n := db.n.Load(); n != 4 {
				t.Fatalf("ran %d statements, want 4 batches of at most 10", n)
			}
			var left, recent int
			rows, err := env.DB.Query(ctx, `SELECT count(*), count(*) FILTER (WHERE message_id LIKE 'recent-%') FROM `+d.InboxTable())
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				if err := rows.Scan(&left, &recent); err != nil {
					t.Fatal(err)
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if left != 5 || recent != 5 {
				t.Fatalf("%d rows left, %d of them recent; want the 5 recent rows", left, recent)
			}
			if n, err := cl.CleanOnce(ctx); err != nil || n != 0 {
				t.Fatalf("second CleanOnce deleted %d, %v", n, err)
			}
		})
	}
}
