package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("backlog", "forwarder read rate from a 10M-row backlog vs a 10k-row one (Postgres, no-op publisher; -n sets the large backlog; BACKLOG_PARTITIONED=1 for the partitioned layout)", runBacklog)
}

const (
	backlogSmall   = 10000  // rows of the small backlog, drained whole
	backlogSlice   = 200000 // rows drained from the large backlog
	backlogKeys    = 10000  // ordering keys the rows spread over
	backlogPayload = 200    // payload bytes per row
	backlogChunk   = 250000 // rows per fill statement
)

// runBacklog measures whether the forwarder's read path holds its rate when
// the outbox holds a large backlog, as after a broker outage. It fills the
// same outbox with a small backlog (10,000 rows, drained whole, three
// rounds) and then with a large one (-n, default 10,000,000 rows, of which
// three consecutive 200,000-row slices are drained) and compares the rates.
//
// BACKLOG_SLICES=N drains N slices instead of three, to show how the read
// slows as deleted rows pile up at the head of the pending index until
// vacuum removes them; the ratio still takes the first three. After the
// slices the bench runs VACUUM and drains one more slice.
//
// The publisher drops messages, so the rate is that of the forwarder's
// read, dispatch and acknowledgement against the database: what a large
// table could slow down. A broker would only add a cost that does not
// depend on the backlog.
//
// The rows are written by INSERT … SELECT generate_series, in chunks, with
// the key hash the publisher would compute. After each fill the bench runs
// VACUUM (ANALYZE): the outbox sets autovacuum_vacuum_insert_scale_factor =
// 0.01, so autovacuum would have vacuumed and analyzed it long before 10M
// rows; run on a server with autovacuum off, the bench does it itself.
// It does not vacuum while draining: autovacuum looks at a table at most
// once per autovacuum_naptime (1 minute by default), longer than a slice
// takes, so a live server would not have vacuumed either.
func runBacklog(ctx context.Context, o options) error {
	large := orDefault(o.n, 10_000_000)
	small := min(backlogSmall, large)
	slices := 3
	if v := os.Getenv("BACKLOG_SLICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 3 {
			return fmt.Errorf("BACKLOG_SLICES=%q: want an integer of at least 3", v)
		}
		slices = n
	}
	// A forwarder reads ahead of what it has published, so the slices
	// leave room for what it takes beyond each before it stops.
	slice := min(backlogSlice, large/(slices+3))
	if slice < 1 {
		return fmt.Errorf("-n %d: too small", large)
	}
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer dropSchema(pool, schema)
	opts := postgres.Options{Schema: schema}
	layout := "plain"
	if os.Getenv("BACKLOG_PARTITIONED") == "1" {
		opts.Partitioned = &postgres.PartitionOptions{}
		layout = "partitioned"
	}
	d, err := postgres.New(opts)
	if err != nil {
		return err
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), d); err != nil {
		return err
	}
	b := &backlogBench{pool: pool, d: d, url: o.pgURL, o: o}
	b.hashes = make([]int32, backlogKeys)
	for i := range b.hashes {
		b.hashes[i] = forwarder.KeyHash("key-" + strconv.Itoa(i))
	}
	fmt.Printf("%s outbox, %d keys, %d-byte payloads, no-op publisher, forwarder defaults (batch %d, concurrency %d)\n",
		layout, backlogKeys, backlogPayload, orDefault(o.batch, forwarder.DefaultBatchSize), orDefault(o.concurrency, forwarder.DefaultConcurrency))

	// Small backlog: three rounds, each a fresh fill drained whole.
	var smallRates, smallSteady []float64
	for round := 1; round <= 3; round++ {
		if _, err := pool.Exec(ctx, `TRUNCATE `+d.OutboxTable()); err != nil {
			return err
		}
		if err := b.fill(ctx, small, false); err != nil {
			return err
		}
		r, err := b.drain(ctx, small)
		if err != nil {
			return err
		}
		fmt.Printf("%d-row backlog, round %d: drained %d rows at %.0f msg/s, %.0f msg/s after the first message (%v)\n",
			small, round, small, r.rate, r.steady, r.first.Round(time.Millisecond))
		smallRates = append(smallRates, r.rate)
		smallSteady = append(smallSteady, r.steady)
	}
	smallRate := median(smallRates)

	// Large backlog: one fill, consecutive slices.
	if _, err := pool.Exec(ctx, `TRUNCATE `+d.OutboxTable()); err != nil {
		return err
	}
	fillStart := time.Now()
	if err := b.fill(ctx, large, true); err != nil {
		return err
	}
	fmt.Printf("filled %d rows in %v\n", large, time.Since(fillStart).Round(time.Second))
	if err := b.report(ctx, "after the fill"); err != nil {
		return err
	}
	var largeRates, largeSteady []float64
	for i := 1; i <= slices; i++ {
		r, err := b.drain(ctx, slice)
		if err != nil {
			return err
		}
		fmt.Printf("%d-row backlog, slice %d: drained %d rows at %.0f msg/s, %.0f msg/s after the first message (%v)\n",
			large, i, slice, r.rate, r.steady, r.first.Round(time.Millisecond))
		if i <= 3 {
			largeRates = append(largeRates, r.rate)
			largeSteady = append(largeSteady, r.steady)
		}
	}
	if err := b.report(ctx, "after draining"); err != nil {
		return err
	}
	if err := b.explain(ctx); err != nil {
		return err
	}
	// What autovacuum would do next: remove the deleted rows' index
	// entries, so that reads start at the first pending row again.
	vstart := time.Now()
	if _, err := pool.Exec(ctx, `VACUUM `+d.OutboxTable()); err != nil {
		return err
	}
	vacuumTime := time.Since(vstart)
	r, err := b.drain(ctx, slice)
	if err != nil {
		return err
	}
	fmt.Printf("VACUUM took %v; then drained %d rows at %.0f msg/s, %.0f msg/s after the first message\n",
		vacuumTime.Round(time.Millisecond), slice, r.rate, r.steady)
	largeRate := median(largeRates)
	fmt.Printf("median: %.0f msg/s from %d rows, %.0f msg/s from %d rows\n", smallRate, small, largeRate, large)
	// The ratio counts the forwarder's start, which weighs more on the
	// short drains of the small backlog; the steady ratio leaves it out.
	summary("small_msgs_per_s", int(smallRate), "large_msgs_per_s", int(largeRate), "backlog_ratio", largeRate/smallRate,
		"backlog_ratio_steady", median(largeSteady)/median(smallSteady))
	return nil
}

type backlogBench struct {
	pool   *pgxpool.Pool
	d      *postgres.Dialect
	url    string
	o      options
	hashes []int32 // key hash of key-i
	next   int64   // first series value of the next fill
}

// fill inserts n pending rows in chunks, then vacuums and analyzes the
// outbox as autovacuum would have.
func (b *backlogBench) fill(ctx context.Context, n int, progress bool) error {
	payload := make([]byte, backlogPayload)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	// Values are parameters; only the table name is spliced in, and it is
	// quoted by the dialect.
	q := `INSERT INTO ` + b.d.OutboxTable() + ` (topic, uuid, payload, metadata, key, key_hash)
SELECT 'bench', gen_random_uuid()::text, $1::bytea,
	jsonb_build_object('partition_key', 'key-' || (g % $2), 'seq', (g / $2)::text),
	'key-' || (g % $2), ($3::int[])[g % $2 + 1]
FROM generate_series($4::bigint, $5::bigint) g`
	start := time.Now()
	for done := 0; done < n; {
		c := min(backlogChunk, n-done)
		from := b.next
		if _, err := b.pool.Exec(ctx, q, payload, int64(backlogKeys), b.hashes, from, from+int64(c)-1); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
		b.next += int64(c)
		done += c
		if progress {
			el := time.Since(start)
			fmt.Printf("  filled %d/%d rows in %v (%.0f rows/s)\n", done, n, el.Round(time.Second), float64(done)/el.Seconds())
		}
	}
	fillTime := time.Since(start)
	vstart := time.Now()
	if _, err := b.pool.Exec(ctx, `VACUUM (ANALYZE) `+b.d.OutboxTable()); err != nil {
		return fmt.Errorf("vacuum: %w", err)
	}
	if progress {
		fmt.Printf("  insert %v, VACUUM (ANALYZE) %v\n", fillTime.Round(time.Millisecond), time.Since(vstart).Round(time.Millisecond))
	}
	return nil
}

type drainResult struct {
	rate   float64       // rows per second from Run to the last row
	steady float64       // rows per second from the first row to the last
	first  time.Duration // from Run to the first published row
}

// drain runs a forwarder on a pool of its own until n rows were published
// and closes both. Closing the pool ends its backends, which flushes their
// statistics (dead tuples) for report.
func (b *backlogBench) drain(ctx context.Context, n int) (drainResult, error) {
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		return drainResult{}, err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return drainResult{}, err
	}
	defer pool.Close()
	dest := &firstPublisher{all: make(chan struct{}), want: int64(n)}
	f, err := forwarder.New(forwarder.Config{
		DB:          pgxv5.WrapPool(pool),
		Dialect:     b.d,
		Destination: dest,
		BatchSize:   b.o.batch,
		Concurrency: b.o.concurrency,
	})
	if err != nil {
		return drainResult{}, err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	select {
	case <-dest.all:
	case err := <-errc:
		return drainResult{}, fmt.Errorf("forwarder stopped: %v", err)
	case <-ctx.Done():
		return drainResult{}, ctx.Err()
	}
	elapsed := time.Since(start)
	if err := f.Close(); err != nil {
		return drainResult{}, err
	}
	if err := <-errc; err != nil {
		return drainResult{}, err
	}
	first := dest.firstAt.Sub(start)
	return drainResult{
		rate:   float64(n) / elapsed.Seconds(),
		steady: float64(n) / (elapsed - first).Seconds(),
		first:  first,
	}, nil
}

// outboxRels selects the outbox's tables (the outbox or its partitions)
// for pg_class queries: $1 is the schema, $2 the table name.
const outboxRels = `WITH t AS (SELECT c.oid, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE n.nspname = $1 AND c.relkind = 'r'
	AND (c.relname = $2 OR c.relname ~ ('^' || $2 || '_(p[0-9]{8}_[0-9]{4}|default)$')))
`

// report prints the outbox's size, its indexes' sizes and its dead tuples.
func (b *backlogBench) report(ctx context.Context, when string) error {
	schema, table := b.d.Schema(), b.d.Options().OutboxTable
	// Backends flush their statistics when they exit, shortly after the
	// forwarder's pool closed them; wait until the count settles.
	var dead int64
	for i := 0; i < 20; i++ {
		var d2 int64
		err := b.pool.QueryRow(ctx, outboxRels+`SELECT coalesce(sum(s.n_dead_tup), 0)::bigint
FROM t JOIN pg_stat_user_tables s ON s.relid = t.oid`, schema, table).Scan(&d2)
		if err != nil {
			return err
		}
		if i > 0 && d2 == dead {
			break
		}
		dead = d2
		time.Sleep(250 * time.Millisecond)
	}
	var pending int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.d.OutboxTable()).Scan(&pending); err != nil {
		return err
	}
	var size int64
	if err := b.pool.QueryRow(ctx, outboxRels+`SELECT coalesce(sum(pg_table_size(t.oid)), 0)::bigint FROM t`, schema, table).Scan(&size); err != nil {
		return err
	}
	// Index sizes summed over partitions, by the name of the index on
	// the outbox itself.
	// A partition's index is named after its parent index on the outbox.
	rows, err := b.pool.Query(ctx, outboxRels+`, n AS (SELECT i.oid, coalesce(p.relname, i.relname) AS name
	FROM t JOIN pg_index x ON x.indrelid = t.oid JOIN pg_class i ON i.oid = x.indexrelid
	LEFT JOIN pg_inherits h ON h.inhrelid = i.oid LEFT JOIN pg_class p ON p.oid = h.inhparent)
SELECT CASE WHEN name LIKE '%pkey' THEN 'pkey' ELSE substring(name from '(pending|retry|dead)_idx$') END,
	sum(pg_relation_size(oid))::bigint
FROM n GROUP BY 1 ORDER BY 1`, schema, table)
	if err != nil {
		return err
	}
	var idx []string
	for rows.Next() {
		var name *string
		var sz int64
		if err := rows.Scan(&name, &sz); err != nil {
			rows.Close()
			return err
		}
		n := "other"
		if name != nil {
			n = *name
		}
		idx = append(idx, fmt.Sprintf("%s %s", n, mib(sz)))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	fmt.Printf("%s: table %s, %d pending rows, dead tuples %d; indexes: %s\n", when, mib(size), pending, dead, strings.Join(idx, ", "))
	return nil
}

// explain prints the plan of the forwarder's read of every partition, as
// the forwarder runs it while draining (in a transaction with JIT off), with
// the parameter values and then as a generic plan.
func (b *backlogBench) explain(ctx context.Context) error {
	owned := make([]int, forwarder.DefaultPartitions)
	for i := range owned {
		owned[i] = i
	}
	q, err := capturePendingRead(ctx, b.d, sqladapters.PendingQuery{
		Partitions: forwarder.DefaultPartitions, Owned: owned,
		Limit: orDefault(b.o.batch, forwarder.DefaultBatchSize),
	})
	if err != nil {
		return err
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		for _, s := range []string{`SET LOCAL jit = off`, `SET LOCAL plan_cache_mode = ` + mode} {
			if _, err := tx.Exec(ctx, s); err != nil {
				_ = tx.Rollback(ctx)
				return err
			}
		}
		rows, err := tx.Query(ctx, `EXPLAIN (ANALYZE, BUFFERS) `+q.SQL, q.Args...)
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		_ = tx.Rollback(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("EXPLAIN (ANALYZE, BUFFERS) of the pending read, %s:\n", mode)
		for _, l := range lines {
			fmt.Println("  " + l)
		}
	}
	return nil
}

// firstPublisher drops messages, counts them and notes the first.
type firstPublisher struct {
	n       atomic.Int64
	first   sync.Once
	firstAt time.Time
	once    sync.Once
	all     chan struct{}
	want    int64
}

func (p *firstPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.first.Do(func() { p.firstAt = time.Now() })
	if p.n.Add(int64(len(msgs))) >= p.want {
		p.once.Do(func() { close(p.all) })
	}
	return nil
}

func (p *firstPublisher) Close() error { return nil }

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// capturePendingRead returns the statement d runs for a pending read of q:
// it hands d an executor that records the statement instead of running it.
func capturePendingRead(ctx context.Context, d sqladapters.Dialect, q sqladapters.PendingQuery) (sqladapters.Query, error) {
	var rec recorder
	_, _ = d.ReadPending(ctx, &rec, q, false)
	if rec.q.SQL == "" {
		return rec.q, errors.New("the dialect ran no statement for the pending read")
	}
	return rec.q, nil
}

// recorder is an executor that records the first statement it is given
// and fails it.
type recorder struct{ q sqladapters.Query }

var errRecorded = errors.New("recorded, not run")

func (r *recorder) Exec(_ context.Context, query string, args ...any) (int64, error) {
	r.record(query, args)
	return 0, errRecorded
}

func (r *recorder) Query(_ context.Context, query string, args ...any) (sqladapters.Rows, error) {
	r.record(query, args)
	return nil, errRecorded
}

func (r *recorder) record(query string, args []any) {
	if r.q.SQL == "" {
		r.q = sqladapters.Query{SQL: query, Args: args}
	}
}
