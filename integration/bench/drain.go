package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync/atomic"
	"time"

	stdsql "database/sql"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("drain-efficiency", "drain-limit and forward-noop alternately, five rounds on fresh outboxes: the forwarder's share of the database's ceiling", runDrainEfficiency)
}

// runDrainEfficiency alternates the bare claim-and-delete drain with the
// forwarder draining to a publisher that drops messages, on equal fresh
// backlogs, so that both sides of a round see about the same machine
// load; it reports the median of the rounds' ratios, the CPU both spent
// per row, and the forwarder's statements per 1,000 rows. CPU samples of
// the forwarder carry the label phase=noop (go tool pprof -tagfocus
// phase=noop); MILLBOX_BENCH_NOOP_PROFILE=file writes a CPU profile of
// the forward phases alone (the last round's), runtime work included.
func runDrainEfficiency(ctx context.Context, o options) error {
	n := orDefault(o.n, 200000)
	const rounds = 5
	var ratios, cpuRatios, drains, noops, stmts []float64
	for round := range rounds {
		drain, err := drainOnce(ctx, o, n)
		if err != nil {
			return err
		}
		noop, err := noopOnce(ctx, o, n)
		if err != nil {
			return err
		}
		fmt.Printf("round %d: drain-limit %.0f rows/s, CPU per row %.1f µs (Go %.1f, Postgres %.1f); forward-noop %.0f msg/s, %.1f µs (Go %.1f, Postgres %.1f); ratio %.2f, CPU ratio %.2f; %.1f statements per 1,000 rows; reads returned %.2f rows per row forwarded\n",
			round+1, drain.rate, drain.cpu, drain.goCPU, drain.pgCPU, noop.rate, noop.cpu, noop.goCPU, noop.pgCPU,
			noop.rate/drain.rate, drain.cpu/noop.cpu, noop.statements, noop.readRows)
		ratios = append(ratios, noop.rate/drain.rate)
		cpuRatios = append(cpuRatios, drain.cpu/noop.cpu)
		drains, noops, stmts = append(drains, drain.rate), append(noops, noop.rate), append(stmts, noop.statements)
	}
	summary("drain_limit_rows_per_s", int(median(drains)), "noop_msgs_per_s", int(median(noops)),
		"noop_vs_drain_limit", median(ratios), "cpu_drain_vs_noop", median(cpuRatios),
		"statements_per_1000_rows", median(stmts))
	return nil
}

// sideResult is one side of a round: its rate, and the CPU this process
// and its Postgres backends spent per row.
type sideResult struct {
	rate, cpu            float64
	goCPU, pgCPU         float64
	statements, readRows float64 // the forwarder's, per 1,000 rows and per row
}

// cpuMeter reads the CPU time of this process and of the Postgres
// backends of pool's connections (idle ones: read it when the pool is
// idle), so that other load on the server does not count.
type cpuMeter struct {
	pool  *pgxpool.Pool
	start map[uint32]uint64
	proc  time.Duration
}

func startCPU(ctx context.Context, pool *pgxpool.Pool) *cpuMeter {
	return &cpuMeter{pool: pool, start: backendTicks(ctx, pool), proc: processCPU()}
}

// perRow returns the CPU time since start in microseconds per row, of
// this process and of the backends; backends that connected meanwhile
// count from zero.
func (m *cpuMeter) perRow(ctx context.Context, rows int) (proc, backends float64) {
	var pg time.Duration
	for pid, t := range backendTicks(ctx, m.pool) {
		pg += time.Duration(t-m.start[pid]) * 10 * time.Millisecond // USER_HZ
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(rows) }
	return us(processCPU() - m.proc), us(pg)
}

func backendTicks(ctx context.Context, pool *pgxpool.Pool) map[uint32]uint64 {
	out := map[uint32]uint64{}
	for _, c := range pool.AcquireAllIdle(ctx) {
		pid := c.Conn().PgConn().PID()
		if t, err := procTicks(int(pid)); err == nil {
			out[pid] = t
		}
		c.Release()
	}
	return out
}

func drainOnce(ctx context.Context, o options, n int) (sideResult, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return sideResult{}, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return sideResult{}, err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return sideResult{}, err
	}
	cpu := startCPU(ctx, pool)
	rate, err := drainLimit(ctx, pool, d)
	goCPU, pgCPU := cpu.perRow(ctx, n)
	return sideResult{rate: rate, cpu: goCPU + pgCPU, goCPU: goCPU, pgCPU: pgCPU}, err
}

// noopOnce runs the forwarder to a publisher that drops messages.
func noopOnce(ctx context.Context, o options, n int) (sideResult, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return sideResult{}, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return sideResult{}, err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return sideResult{}, err
	}
	counted := &countingDB{DB: db}
	dest := newCounting(n)
	var read atomic.Int64
	cfg := forwarder.Config{
		DB:          counted,
		Dialect:     d,
		Destination: dest,
		BatchSize:   o.batch,
		Concurrency: o.concurrency,
		Hooks:       forwarder.Hooks{OnRead: func(rows int) { read.Add(int64(rows)) }},
	}
	var inv float64
	if path := os.Getenv("MILLBOX_BENCH_NOOP_PROFILE"); path != "" {
		// The forward phase alone, runtime included (GC, scheduler):
		// what -cpuprofile mixes with the prefill.
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	cpu := startCPU(ctx, pool)
	pprof.Do(ctx, pprof.Labels("phase", "noop"), func(ctx context.Context) {
		inv, err = millboxForward(ctx, cfg, dest.all)
	})
	if err != nil {
		return sideResult{}, err
	}
	goCPU, pgCPU := cpu.perRow(ctx, n)
	return sideResult{
		rate:       inv * float64(n),
		cpu:        goCPU + pgCPU,
		goCPU:      goCPU,
		pgCPU:      pgCPU,
		statements: float64(counted.n.Load()) * 1000 / float64(n),
		readRows:   float64(read.Load()) / float64(n),
	}, nil
}

// countingDB counts the statements run through it, transaction control
// included (the forwarder's lease keeping too, a few per second).
type countingDB struct {
	sqladapters.DB
	n atomic.Int64
}

func (c *countingDB) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	c.n.Add(1)
	return c.DB.Exec(ctx, q, args...)
}

func (c *countingDB) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	c.n.Add(1)
	return c.DB.Query(ctx, q, args...)
}

func (c *countingDB) Begin(ctx context.Context, opts stdsql.TxOptions) (sqladapters.Tx, error) {
	tx, err := c.DB.Begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.n.Add(1)
	return &countingTx{Tx: tx, n: &c.n}, nil
}

type countingTx struct {
	sqladapters.Tx
	n *atomic.Int64
}

func (t *countingTx) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	t.n.Add(1)
	return t.Tx.Exec(ctx, q, args...)
}

func (t *countingTx) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	t.n.Add(1)
	return t.Tx.Query(ctx, q, args...)
}

func (t *countingTx) Commit(ctx context.Context) error {
	t.n.Add(1)
	return t.Tx.Commit(ctx)
}

func (t *countingTx) Rollback(ctx context.Context) error {
	t.n.Add(1)
	return t.Tx.Rollback(ctx)
}
