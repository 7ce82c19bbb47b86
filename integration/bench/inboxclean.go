package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("inbox-clean", "inbox cleaner deleting a 10M-row backlog of old records while a consumer records new ones (Postgres; -n sets the rows; INBOXCLEAN_BEFORE_ONLY=1 without range deletes)", runInboxClean)
}

const (
	inboxCleanChunk   = 500000 // rows per fill statement
	inboxCleanWorkers = 4      // consumer goroutines
	inboxCleanRate    = 1000   // records per second the consumer offers
)

// runInboxClean fills the inbox with -n records (default 10,000,000) older
// than the retention window, as a consumer that ran for weeks without a
// cleaner would leave, then runs one CleanOnce with the default batch size
// while a consumer keeps recording new messages, paced at 1,000 records per
// second over four goroutines, each in its own transaction as the inbox
// middleware does. It prints the deletion rate, the statements' durations
// and the consumer's latency (begin, record, commit) before and during the
// cleaning.
//
// After the fill the bench runs VACUUM (ANALYZE), which autovacuum would
// have done on a live server (this one may run with autovacuum off); it
// does not vacuum while cleaning. INBOXCLEAN_BEFORE_ONLY=1 makes the
// cleaner start every batch at the oldest row (DeleteInboxBefore alone),
// to compare.
func runInboxClean(ctx context.Context, o options) error {
	n := orDefault(o.n, 10_000_000)
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer dropSchema(pool, schema)
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		return err
	}

	// Old records: received 30 to 16 days ago, spread evenly, so the
	// default 14-day retention takes them all.
	span := 14 * 24 * time.Hour
	step := span / time.Duration(n)
	fillStart := time.Now()
	for done := 0; done < n; {
		c := min(inboxCleanChunk, n-done)
		_, err := pool.Exec(ctx, `INSERT INTO `+d.InboxTable()+` (consumer, message_id, received_at)
SELECT 'bench/orders', 'msg-' || g, now() - interval '30 days' + g * ($3::bigint * interval '1 microsecond')
FROM generate_series($1::bigint, $2::bigint) g`, int64(done), int64(done+c-1), step.Microseconds())
		if err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		done += c
		el := time.Since(fillStart)
		fmt.Printf("  filled %d/%d old records in %v (%.0f rows/s)\n", done, n, el.Round(time.Second), float64(done)/el.Seconds())
	}
	insertTime := time.Since(fillStart)
	vstart := time.Now()
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+d.InboxTable()); err != nil {
		return err
	}
	fmt.Printf("filled %d records: insert %v, VACUUM (ANALYZE) %v\n", n, insertTime.Round(time.Millisecond), time.Since(vstart).Round(time.Millisecond))
	if err := inboxSizes(ctx, db, d, "after the fill"); err != nil {
		return err
	}

	ib, err := inbox.New(inbox.Config{Dialect: d})
	if err != nil {
		return err
	}
	c := &inboxConsumer{db: db, ib: ib}
	cctx, stopConsumer := context.WithCancel(ctx)
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.run(cctx) }()

	// Before: ten seconds of the consumer alone.
	time.Sleep(10 * time.Second)
	before := c.take()

	timed := &timedDB{DB: db}
	var cd sqladapters.Dialect = d
	if os.Getenv("INBOXCLEAN_BEFORE_ONLY") == "1" {
		// Every batch from the oldest row.
		cd = beforeOnly{d}
		fmt.Println("cleaner without range deletes: every batch starts at the oldest row")
	}
	cl, err := inbox.NewCleaner(inbox.CleanerConfig{DB: timed, Dialect: cd})
	if err != nil {
		stopConsumer()
		return err
	}
	start := time.Now()
	deleted, cleanErr := cl.CleanOnce(ctx)
	elapsed := time.Since(start)
	during := c.take()
	stopConsumer()
	if err := <-consumerDone; err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	if cleanErr != nil {
		return cleanErr
	}
	batches := timed.take()
	fmt.Printf("cleaner: deleted %d records in %v: %.0f records/s, %d statements of up to %d rows\n",
		deleted, elapsed.Round(time.Millisecond), float64(deleted)/elapsed.Seconds(), len(batches), inbox.DefaultBatchSize)
	fmt.Printf("statement time: p50 %v, p99 %v, max %v; first 10%% of statements p50 %v, last 10%% p50 %v\n",
		pct(batches, 50), pct(batches, 99), pct(batches, 100),
		pct(batches[:max(1, len(batches)/10)], 50), pct(batches[len(batches)-max(1, len(batches)/10):], 50))
	fmt.Printf("consumer before: %d records, p50 %v, p99 %v, max %v\n", len(before), pct(before, 50), pct(before, 99), pct(before, 100))
	fmt.Printf("consumer during: %d records, p50 %v, p99 %v, max %v\n", len(during), pct(during, 50), pct(during, 99), pct(during, 100))
	if err := inboxSizes(ctx, db, d, "after cleaning"); err != nil {
		return err
	}
	summary("deleted", deleted, "delete_per_s", int(float64(deleted)/elapsed.Seconds()), "statements", len(batches),
		"p99_before_ms", ms(pct(before, 99)), "p99_during_ms", ms(pct(during, 99)))
	return nil
}

// beforeOnly starts every batch of deletes at the oldest row, as a cleaner
// without range deletes would.
type beforeOnly struct{ sqladapters.Dialect }

func (b beforeOnly) DeleteInbox(ctx context.Context, e sqladapters.Executor, _, before time.Time, limit int) (int64, time.Time, error) {
	return b.Dialect.DeleteInbox(ctx, e, time.Time{}, before, limit)
}

// inboxConsumer records new messages in their own transactions at a steady
// pace and keeps their latencies.
type inboxConsumer struct {
	db sqladapters.DB
	ib *inbox.Inbox
	mu sync.Mutex
	ds []time.Duration
}

func (c *inboxConsumer) run(ctx context.Context) error {
	jobs := make(chan int)
	errc := make(chan error, inboxCleanWorkers)
	var wg sync.WaitGroup
	for range inboxCleanWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				start := time.Now()
				tx, first, err := c.ib.BeginRecord(ctx, c.db, sql.TxOptions{}, "bench/orders", "new-"+strconv.Itoa(i))
				if err == nil && first {
					err = tx.Commit(ctx)
				}
				if err != nil {
					if ctx.Err() == nil {
						errc <- err
					}
					return
				}
				c.mu.Lock()
				c.ds = append(c.ds, time.Since(start))
				c.mu.Unlock()
			}
		}()
	}
	tick := time.NewTicker(time.Second / inboxCleanRate)
	defer tick.Stop()
	var err error
loop:
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			break loop
		case err = <-errc:
			break loop
		case <-tick.C:
		}
		select {
		case jobs <- i:
		default: // every worker busy: this record is late, skip the tick
		}
	}
	close(jobs)
	wg.Wait()
	return err
}

// take returns the latencies since the last call, sorted.
func (c *inboxConsumer) take() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	ds := c.ds
	c.ds = nil
	slices.Sort(ds)
	return ds
}

// timedDB times each statement the cleaner runs.
type timedDB struct {
	sqladapters.DB
	mu sync.Mutex
	ds []time.Duration
}

func (t *timedDB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	start := time.Now()
	n, err := t.DB.Exec(ctx, query, args...)
	t.mu.Lock()
	t.ds = append(t.ds, time.Since(start))
	t.mu.Unlock()
	return n, err
}

func (t *timedDB) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	start := time.Now()
	rows, err := t.DB.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &timedRows{Rows: rows, t: t, start: start}, nil
}

// timedRows ends a statement's time when its rows are closed.
type timedRows struct {
	sqladapters.Rows
	t     *timedDB
	start time.Time
	done  bool
}

func (r *timedRows) Close() {
	r.Rows.Close()
	if !r.done {
		r.done = true
		r.t.mu.Lock()
		r.t.ds = append(r.t.ds, time.Since(r.start))
		r.t.mu.Unlock()
	}
}

// take returns the statement durations in the order they ran.
func (t *timedDB) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.ds)
}

// pct returns the p-th percentile of ds (100: the maximum).
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)].Round(10 * time.Microsecond)
}

// inboxSizes prints the inbox's size, its indexes' and its dead tuples.
func inboxSizes(ctx context.Context, db sqladapters.DB, d *postgres.Dialect, when string) error {
	rows, err := db.Query(ctx, `SELECT pg_table_size(c.oid), pg_indexes_size(c.oid),
	coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = $1::regclass`, d.InboxTable())
	if err != nil {
		return err
	}
	defer rows.Close()
	var table, idx, live, dead int64
	if rows.Next() {
		if err := rows.Scan(&table, &idx, &live, &dead); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Printf("%s: table %s, indexes %s, live tuples %d, dead tuples %d (statistics may lag a second)\n", when, mib(table), mib(idx), live, dead)
	return nil
}
