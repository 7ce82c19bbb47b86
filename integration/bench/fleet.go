package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	stdsql "database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/polling"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("fleet", "forwarder/fleet serving -fleet-dbs tenant databases and -fleet-schemas tenant schemas from -fleet-instances instances (child processes) on the local PostgreSQL, against one ordinary forwarder per tenant per instance (as many tenants as max_connections allows): connections, idle server CPU and queries/s against an idle server, first message of an idle tenant, busy tenants' latency, a drain of many backlogs against one outbox, a tenant added, an instance killed; -short for a small run, -duration the busy phase (default 10s)", runFleet)
}

var (
	fleetDBs       = flag.Int("fleet-dbs", 200, "fleet: tenant databases")
	fleetSchemas   = flag.Int("fleet-schemas", 2000, "fleet: tenant schemas in one database")
	fleetInstances = flag.Int("fleet-instances", 3, "fleet: fleet instances (child processes)")
	fleetIdleFor   = flag.Duration("fleet-idle", 30*time.Second, "fleet: how long tenants stay idle before the first-message measurement")
	fleetMeasure   = flag.Duration("fleet-measure", 20*time.Second, "fleet: interval of each idle CPU and queries/s measurement")
	fleetBacklog   = flag.Int("fleet-backlog", 10000, "fleet: rows of each drained tenant's backlog")
	fleetDrainN    = flag.Int("fleet-drain-tenants", 20, "fleet: tenants drained together (the single outbox holds all their rows)")
	fleetBusyN     = flag.Int("fleet-busy", 10, "fleet: busy tenants (half databases, half schemas) at -fleet-busy-rate msg/s each")
	fleetBusyRate  = flag.Int("fleet-busy-rate", 100, "fleet: messages per second of each busy tenant")
	fleetMaxConns  = flag.Int("fleet-max-conns", 12, "fleet: fleet.Config.MaxConns of each instance (MaxConnsPerServer is 8 or less)")
	fleetHandle    = flag.Int("fleet-handle-conns", 0, "fleet: pgfleet.ServerConfig.MaxConns, the connections of one tenant database's pool (0 = pgfleet's default)")
	fleetNaiveMax  = flag.Int("fleet-naive", 0, "fleet: tenants of the naive way (0 = as many as max_connections leaves room for)")
	fleetShort     = flag.Bool("short", false, "fleet: a small run (20 databases, 200 schemas, 1,000-row backlogs, 10 s idle)")
)

// Environment of a fleet instance's child process.
const (
	fleetChildEnv   = "MILLBOX_BENCH_FLEET_CHILD" // the instance's ID
	fleetRunEnv     = "MILLBOX_BENCH_FLEET_RUN"   // the run's prefix of database names
	fleetBaseEnv    = "MILLBOX_BENCH_FLEET_URL"   // the server's URL
	fleetMaxConnEnv = "MILLBOX_BENCH_FLEET_MAXCONNS"
)

// fleetSample is how many tenants of each kind the first-message and the
// failover measurements publish into.
const fleetSample = 20

// fleetRun is one run of the case: the names it creates, the admin pool,
// the instances and what arrived.
type fleetRun struct {
	o      options
	prefix string // of every database the run creates
	admin  *pgxpool.Pool
	schDB  *pgxpool.Pool // the schema tenants' database
	ctl    *pgxpool.Pool // the control database
	store  sqladapters.FleetStore
	dbs    []string // tenant databases
	drains []string // databases with a backlog, registered for the drain
	adds   []string // databases registered for the add measurement
	schs   []string // tenant schemas
	addSch []string
	single string // the one outbox of the drain's baseline
	arr    *fleetArrivals
	kids   []*fleetChild
	peak   atomic.Int64 // most fleet connections seen
}

func runFleet(ctx context.Context, o options) error {
	if id := os.Getenv(fleetChildEnv); id != "" {
		return runFleetChild(ctx, o, id)
	}
	if *fleetShort {
		setDefault := func(name, v string) {
			set := false
			flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
			if !set {
				_ = flag.Set(name, v)
			}
		}
		setDefault("fleet-dbs", "20")
		setDefault("fleet-schemas", "200")
		setDefault("fleet-backlog", "1000")
		setDefault("fleet-idle", "10s")
		setDefault("fleet-measure", "10s")
	}
	r := &fleetRun{o: o, prefix: fmt.Sprintf("mbfleet_%d_", time.Now().Unix()%1000000), arr: newFleetArrivals()}
	admin, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return err
	}
	r.admin = admin
	defer admin.Close()
	// Everything the run creates is dropped at the end, on an error and
	// on an interrupt too (the context ends, the phases return).
	defer r.cleanup()
	if err := r.setup(ctx); err != nil {
		return err
	}
	return r.measure(ctx)
}

// dbURL is the server's URL with database name.
func dbURL(base, name, app string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.Path = "/" + name
	q := u.Query()
	if app != "" {
		q.Set("application_name", app)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func (r *fleetRun) exec(ctx context.Context, sql string) error {
	_, err := r.admin.Exec(ctx, sql)
	return err
}

func (r *fleetRun) setup(ctx context.Context) error {
	start := time.Now()
	fmt.Printf("fleet: creating %d tenant databases, %d tenant schemas, %d drain tenants with %d rows each and a single outbox of %d rows (databases named %s*)\n",
		*fleetDBs, *fleetSchemas, *fleetDrainN, *fleetBacklog, *fleetDrainN**fleetBacklog, r.prefix)
	// A template with the tables: each tenant database is a copy, which
	// is much cheaper than migrating each.
	tpl := r.prefix + "tpl"
	if err := r.exec(ctx, "CREATE DATABASE "+tpl); err != nil {
		return err
	}
	if err := migrateDB(ctx, dbURL(r.o.pgURL, tpl, ""), ""); err != nil {
		return err
	}
	mk := func(name string) error {
		return r.exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tpl)
	}
	for i := range *fleetDBs {
		name := fmt.Sprintf("%sd%04d", r.prefix, i)
		if err := mk(name); err != nil {
			return err
		}
		r.dbs = append(r.dbs, name)
		if (i+1)%50 == 0 || i+1 == *fleetDBs {
			fmt.Printf("  %d of %d tenant databases (%v)\n", i+1, *fleetDBs, time.Since(start).Round(time.Second))
		}
	}
	for i := range *fleetDrainN {
		name := fmt.Sprintf("%sr%02d", r.prefix, i)
		if err := mk(name); err != nil {
			return err
		}
		r.drains = append(r.drains, name)
	}
	for i := range 3 {
		name := fmt.Sprintf("%sa%d", r.prefix, i)
		if err := mk(name); err != nil {
			return err
		}
		r.adds = append(r.adds, name)
	}
	r.single = r.prefix + "single"
	if err := mk(r.single); err != nil {
		return err
	}
	// The control database, of the run's own, so that its queries are
	// told apart from those of the server's other users.
	if err := r.exec(ctx, "CREATE DATABASE "+r.prefix+"ctl"); err != nil {
		return err
	}
	ctl, err := pgxpool.New(ctx, dbURL(r.o.pgURL, r.prefix+"ctl", "mbbench_admin"))
	if err != nil {
		return err
	}
	r.ctl = ctl
	r.store = postgres.MustNewFleet(postgres.FleetOptions{})
	if err := sqladapters.MigrateFleet(ctx, pgxv5.WrapPool(ctl), r.store); err != nil {
		return err
	}
	// The schema tenants' database.
	if err := r.exec(ctx, "CREATE DATABASE "+r.prefix+"sch"); err != nil {
		return err
	}
	cfg, err := pgxpool.ParseConfig(dbURL(r.o.pgURL, r.prefix+"sch", "mbbench_admin"))
	if err != nil {
		return err
	}
	cfg.MaxConns = 8
	if r.schDB, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return err
	}
	names := make(chan string)
	var done atomic.Int64
	var firstErr error
	var errMu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for s := range names {
				d := postgres.MustNew(postgres.Options{Schema: s, WithoutInbox: true})
				if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(r.schDB), d); err != nil {
					errMu.Lock()
					firstErr = cmpErr(firstErr, err)
					errMu.Unlock()
					continue
				}
				if n := done.Add(1); n%500 == 0 || int(n) == *fleetSchemas+3 {
					fmt.Printf("  %d of %d tenant schemas (%v)\n", n, *fleetSchemas+3, time.Since(start).Round(time.Second))
				}
			}
		})
	}
	for i := range *fleetSchemas + 3 {
		s := fmt.Sprintf("s%05d", i)
		if i < *fleetSchemas {
			r.schs = append(r.schs, s)
		} else {
			r.addSch = append(r.addSch, s)
		}
		select {
		case names <- s:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(names)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// The backlogs: each drain tenant's, and all of them in one outbox.
	d := postgres.MustNew(postgres.Options{WithoutInbox: true})
	fill := func(name string, n int) error {
		pool, err := pgxpool.New(ctx, dbURL(r.o.pgURL, name, "mbbench_admin"))
		if err != nil {
			return err
		}
		defer pool.Close()
		if err := prefill(ctx, pgxv5.WrapPool(pool), d, n, 200, 256); err != nil {
			return err
		}
		return analyze(ctx, pgxv5.WrapPool(pool), d, "postgres")
	}
	for _, name := range r.drains {
		if err := fill(name, *fleetBacklog); err != nil {
			return err
		}
	}
	if err := fill(r.single, *fleetDrainN**fleetBacklog); err != nil {
		return err
	}
	fmt.Printf("  backlogs written; setup took %v\n", time.Since(start).Round(time.Second))
	return nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// migrateDB creates the millbox tables (without the inbox) in schema of
// the database at u.
func migrateDB(ctx context.Context, u, schema string) error {
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return err
	}
	defer pool.Close()
	return sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{Schema: schema, WithoutInbox: true}))
}

// cleanup stops the instances and drops every database of the run.
func (r *fleetRun) cleanup() {
	for _, k := range r.kids {
		k.kill()
	}
	if r.schDB != nil {
		r.schDB.Close()
	}
	if r.ctl != nil {
		r.ctl.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := r.admin.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE $1 ORDER BY datname", r.prefix+"%")
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleet: cleanup: %v\n", err)
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		fmt.Fprintf(os.Stderr, "fleet: cleanup: %v\n", err)
		return
	}
	fmt.Printf("fleet: dropping %d databases\n", len(names))
	for _, n := range names {
		// A temporary replication slot goes with its session, which may
		// take a moment after the session was ended: try again.
		for try := 0; ; try++ {
			err := r.exec(ctx, "DROP DATABASE IF EXISTS "+n+" WITH (FORCE)")
			if err == nil || try == 20 {
				if err != nil {
					fmt.Fprintf(os.Stderr, "fleet: cleanup: drop %s: %v\n", n, err)
				}
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// fleetArrivals records when each tracked message arrived at the destination
// (first arrival: at least once may repeat one) and counts all messages.
type fleetArrivals struct {
	mu        sync.Mutex
	arrived   map[string]time.Time
	committed map[string]time.Time
	waiters   map[string]chan struct{}
	total     atomic.Int64
}

func newFleetArrivals() *fleetArrivals {
	return &fleetArrivals{arrived: map[string]time.Time{}, committed: map[string]time.Time{}, waiters: map[string]chan struct{}{}}
}

func (a *fleetArrivals) arrive(at time.Time, n int, ids []string) {
	a.total.Add(int64(n))
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if _, ok := a.arrived[id]; !ok {
			a.arrived[id] = at
			if w := a.waiters[id]; w != nil {
				close(w)
				delete(a.waiters, id)
			}
		}
	}
}

// expect returns a channel closed when id arrives.
func (a *fleetArrivals) expect(id string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := make(chan struct{})
	if _, ok := a.arrived[id]; ok {
		close(c)
		return c
	}
	if w := a.waiters[id]; w != nil {
		return w
	}
	a.waiters[id] = c
	return c
}

func (a *fleetArrivals) commit(id string, at time.Time) {
	a.mu.Lock()
	a.committed[id] = at
	a.mu.Unlock()
}

// latency is id's time from its commit (or from since, when not zero) to
// its arrival, -1 when it did not arrive.
func (a *fleetArrivals) latency(id string, since time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.arrived[id]
	if !ok {
		return -1
	}
	if since.IsZero() {
		since = a.committed[id]
	}
	return at.Sub(since)
}

// waitAll waits until every one of ids arrived or timeout passed.
func (a *fleetArrivals) waitAll(ctx context.Context, ids []string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for _, id := range ids {
		select {
		case <-a.expect(id):
		case <-deadline:
			return fmt.Errorf("not every message arrived within %v", timeout)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// publishOne commits one tracked message into the outbox of dialect d on
// db and records its commit time.
func (r *fleetRun) publishOne(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, key string) (string, error) {
	tx, err := db.Begin(ctx, stdsql.TxOptions{})
	if err != nil {
		return "", err
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		sqladapters.Rollback(tx)
		return "", err
	}
	m := message.NewMessage(watermill.NewUUID(), []byte("fleet bench"))
	m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
	m.Metadata.Set("track", "1")
	if err := pub.Publish("fleet", m); err != nil {
		sqladapters.Rollback(tx)
		return "", err
	}
	// The commit's start: a message may arrive before Commit returns.
	at := time.Now()
	if err := tx.Commit(ctx); err != nil {
		return "", err
	}
	r.arr.commit(m.UUID, at)
	return m.UUID, nil
}

// dbDialect is the dialect of a database tenant's publishers: with
// FlushStats, so that the stat doorbell sees the commit at once.
var dbDialect = postgres.MustNew(postgres.Options{WithoutInbox: true, FlushStats: true})

// publishDB commits one tracked message into tenant database name over a
// connection of its own, as an application's process would.
func (r *fleetRun) publishDB(ctx context.Context, name string) (string, error) {
	conn, err := pgx.Connect(ctx, dbURL(r.o.pgURL, name, "mbbench_pub"))
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return r.publishOne(ctx, pgxv5.WrapConn(conn), dbDialect, name)
}

func (r *fleetRun) publishSchema(ctx context.Context, schema string) (string, error) {
	return r.publishOne(ctx, pgxv5.WrapPool(r.schDB), postgres.MustNew(postgres.Options{Schema: schema, WithoutInbox: true}), schema)
}

// serverLoad is what the whole PostgreSQL server did over an interval.
type serverLoad struct {
	cpuPct       float64 // of one core, all postgres processes
	xactPerS     float64 // all databases
	benchXactPer float64 // the run's databases only
}

// pgTicks sums the CPU ticks of every postgres process, with the
// children they reaped (backends that ended count in the postmaster's).
func pgTicks() uint64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum uint64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		name, ticks, err := parseStat(string(b))
		if err != nil || name != "postgres" || pid <= 0 {
			continue
		}
		sum += ticks
	}
	return sum
}

func (r *fleetRun) xacts(ctx context.Context) (all, bench int64, err error) {
	err = r.admin.QueryRow(ctx, `SELECT coalesce(sum(xact_commit+xact_rollback),0)::bigint,
		coalesce(sum(xact_commit+xact_rollback) FILTER (WHERE datname LIKE $1),0)::bigint FROM pg_stat_database`, r.prefix+"%").Scan(&all, &bench)
	return all, bench, err
}

// load measures the server over d.
func (r *fleetRun) load(ctx context.Context, d time.Duration) (serverLoad, error) {
	a0, b0, err := r.xacts(ctx)
	if err != nil {
		return serverLoad{}, err
	}
	t0, start := pgTicks(), time.Now()
	select {
	case <-time.After(d):
	case <-ctx.Done():
		return serverLoad{}, ctx.Err()
	}
	t1, el := pgTicks(), time.Since(start)
	// The statistics of the last second may not be flushed yet: wait for
	// them, as for those of the first.
	time.Sleep(1500 * time.Millisecond)
	a1, b1, err := r.xacts(ctx)
	if err != nil {
		return serverLoad{}, err
	}
	return serverLoad{
		cpuPct:       float64(t1-t0) * 10 * float64(time.Millisecond) / float64(el) * 100,
		xactPerS:     float64(a1-a0) / el.Seconds(),
		benchXactPer: float64(b1-b0) / el.Seconds(),
	}, nil
}

// conns counts the connections whose application_name starts with
// prefix: all of them and the doorbells'.
func (r *fleetRun) conns(ctx context.Context, prefix string) (all, bells int, err error) {
	err = r.admin.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE application_name LIKE '%_doorbell')
		FROM pg_stat_activity WHERE application_name LIKE $1`, prefix+"%").Scan(&all, &bells)
	return all, bells, err
}

// p99 of ds in ms; -1 when one is missing (did not arrive).
func p99ms(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 || s[0] < 0 {
		return -1
	}
	return ms(percentile(s, 99))
}

func (r *fleetRun) measure(ctx context.Context) error {
	var out [][2]any
	put := func(name string, v any) {
		out = append(out, [2]any{name, v})
		switch v := v.(type) {
		case float64:
			fmt.Printf("%s %.2f\n", name, v)
		default:
			fmt.Printf("%s %v\n", name, v)
		}
	}
	defer func() {
		kv := make([]any, 0, 2*len(out))
		for _, p := range out {
			kv = append(kv, p[0], p[1])
		}
		summary(kv...)
	}()
	put("fleet_tenant_dbs", len(r.dbs))
	put("fleet_tenant_schemas", len(r.schs))
	put("fleet_instances", *fleetInstances)

	// The baseline: the server with neither the fleet nor the naive way.
	fmt.Printf("idle server, no fleet: measuring %v\n", *fleetMeasure)
	base, err := r.load(ctx, *fleetMeasure)
	if err != nil {
		return err
	}
	put("baseline_idle_pg_cpu_pct", base.cpuPct)
	put("baseline_idle_queries_per_s", base.xactPerS)

	// The naive way, on as many database tenants as fit.
	naive, err := r.naive(ctx)
	if err != nil {
		return fmt.Errorf("naive: %w", err)
	}
	put("naive_tenants", naive.tenants)
	put("naive_conns", naive.conns)
	put("naive_conns_per_tenant", float64(naive.conns)/float64(max(naive.tenants, 1)))
	put("naive_idle_pg_cpu_pct", naive.load.cpuPct)
	put("naive_idle_queries_per_s", naive.load.xactPerS)
	put("naive_idle_bench_queries_per_s", naive.load.benchXactPer)

	// The fleet.
	if err := r.startFleet(ctx); err != nil {
		return err
	}
	settled := time.Now()
	all, bells, err := r.conns(ctx, r.appPrefix())
	if err != nil {
		return err
	}
	budget := *fleetMaxConns + 2 // and a doorbell per server
	put("fleet_budget_per_instance", budget)
	put("fleet_conns", all)
	put("fleet_conns_doorbells", bells)
	put("fleet_conns_peak_startup", r.peak.Load())
	// Per tenant, as the naive way ran on fewer tenants.
	put("naive_vs_fleet_conns_per_tenant", (float64(naive.conns)/float64(max(naive.tenants, 1)))/(float64(max(all, 1))/float64(len(r.dbs)+len(r.schs))))

	fmt.Printf("idle fleet: measuring %v\n", *fleetMeasure)
	fl, err := r.load(ctx, *fleetMeasure)
	if err != nil {
		return err
	}
	put("fleet_idle_pg_cpu_pct", fl.cpuPct)
	put("fleet_idle_queries_per_s", fl.xactPerS)
	put("fleet_idle_bench_queries_per_s", fl.benchXactPer)
	put("fleet_idle_cpu_vs_baseline", fl.cpuPct/base.cpuPct)
	put("fleet_idle_queries_vs_baseline", fl.xactPerS/base.xactPerS)
	put("naive_idle_cpu_vs_baseline", naive.load.cpuPct/base.cpuPct)

	// The first message of tenants idle for a while.
	if wait := *fleetIdleFor - time.Since(settled); wait > 0 {
		fmt.Printf("waiting %v more, so that the tenants have been idle for %v\n", wait.Round(time.Second), *fleetIdleFor)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	dbFirst, schFirst, err := r.firstMessages(ctx)
	if err != nil {
		return err
	}
	put("fleet_first_msg_db_p99_ms", p99ms(dbFirst))
	put("fleet_first_msg_schema_p99_ms", p99ms(schFirst))

	busyDB, busySch, err := r.busy(ctx)
	if err != nil {
		return err
	}
	put("fleet_busy_p99_ms", p99ms(append(slices.Clone(busyDB), busySch...)))
	put("fleet_busy_db_p99_ms", p99ms(busyDB))
	put("fleet_busy_schema_p99_ms", p99ms(busySch))

	addDB, addSch, err := r.add(ctx)
	if err != nil {
		return err
	}
	put("fleet_add_db_ms", p99ms(addDB))
	put("fleet_add_schema_ms", p99ms(addSch))

	single, fleetRate, err := r.drain(ctx)
	if err != nil {
		return err
	}
	put("drain_tenants", len(r.drains))
	put("drain_rows_per_tenant", *fleetBacklog)
	put("single_drain_msgs_per_s", single)
	put("fleet_drain_msgs_per_s", fleetRate)
	put("fleet_drain_vs_single", fleetRate/single)

	foDB, foSch, err := r.failover(ctx)
	if err != nil {
		return err
	}
	put("fleet_lease_ttl_ms", fleet.DefaultLeaseTTL.Milliseconds())
	put("fleet_failover_db_ms", p99ms(foDB))
	put("fleet_failover_schema_ms", p99ms(foSch))
	put("fleet_failover_ms", p99ms(append(slices.Clone(foDB), foSch...)))
	return nil
}

// naiveResult is the naive way at steady state.
type naiveResult struct {
	tenants, conns int
	load           serverLoad
}

// naive runs one ordinary forwarder per tenant per instance, each with
// its own pool, on as many database tenants as the server's
// max_connections leaves room for, and measures it idle.
func (r *fleetRun) naive(ctx context.Context) (naiveResult, error) {
	var maxConns, used int
	if err := r.admin.QueryRow(ctx, "SELECT current_setting('max_connections')::int, (SELECT count(*) FROM pg_stat_activity)").Scan(&maxConns, &used); err != nil {
		return naiveResult{}, err
	}
	// Room for the server's other users (tests run beside the bench), and
	// 2 connections per forwarder: its reads and its lease renewals.
	room := maxConns - used - 30
	n := min(len(r.dbs), max(room/(2**fleetInstances), 1))
	if *fleetNaiveMax > 0 {
		n = min(n, *fleetNaiveMax)
	}
	fmt.Printf("naive way: %d of the %d tenant databases (max_connections %d, %d in use), one forwarder per tenant per instance, %d instances\n",
		n, len(r.dbs), maxConns, used, *fleetInstances)
	app := r.prefix + "naive"
	type running struct {
		f    *forwarder.Forwarder
		pool *pgxpool.Pool
		done chan error
	}
	var fwds []running
	stop := func() {
		for _, f := range fwds {
			_ = f.f.Close()
			<-f.done
			f.pool.Close()
		}
	}
	defer stop()
	dest := newCounting(1 << 60)
	for inst := range *fleetInstances {
		for _, name := range r.dbs[:n] {
			cfg, err := pgxpool.ParseConfig(dbURL(r.o.pgURL, name, app))
			if err != nil {
				return naiveResult{}, err
			}
			cfg.MaxConns = 2
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				return naiveResult{}, err
			}
			f, err := forwarder.New(forwarder.Config{
				DB: pgxv5.WrapPool(pool), Dialect: postgres.MustNew(postgres.Options{WithoutInbox: true}),
				Destination: dest, Source: polling.Source{InstanceID: fmt.Sprintf("naive-%d", inst)},
				Logger: watermill.NopLogger{},
			})
			if err != nil {
				pool.Close()
				return naiveResult{}, err
			}
			done := make(chan error, 1)
			go func() { done <- f.Run(context.Background()) }()
			fwds = append(fwds, running{f: f, pool: pool, done: done})
			if err := f.Ready(ctx); err != nil {
				return naiveResult{}, err
			}
		}
	}
	// Steady state: the starts' own statements are over.
	time.Sleep(5 * time.Second)
	conns, _, err := r.conns(ctx, app)
	if err != nil {
		return naiveResult{}, err
	}
	fmt.Printf("idle naive way: %d connections; measuring %v\n", conns, *fleetMeasure)
	load, err := r.load(ctx, *fleetMeasure)
	return naiveResult{tenants: n, conns: conns, load: load}, err
}

func (r *fleetRun) appPrefix() string { return r.prefix + "i" }

func (r *fleetRun) instanceID(i int) string { return fmt.Sprintf("%si%d", r.prefix, i) }

// startFleet starts the instances, registers the tenants and waits until
// every tenant was looked at and the looks' connections are closed.
func (r *fleetRun) startFleet(ctx context.Context) error {
	start := time.Now()
	// The most connections the fleet held, sampled while it runs.
	go func() {
		for ctx.Err() == nil {
			if n, _, err := r.conns(ctx, r.appPrefix()); err == nil && int64(n) > r.peak.Load() {
				r.peak.Store(int64(n))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()
	for i := range *fleetInstances {
		k, err := startFleetChild(ctx, r, i)
		if err != nil {
			return err
		}
		r.kids = append(r.kids, k)
	}
	fmt.Printf("fleet: %d instances ready (%v); registering the tenants\n", len(r.kids), time.Since(start).Round(time.Millisecond))
	var rows []sqladapters.FleetTenant
	for _, name := range r.dbs {
		rows = append(rows, sqladapters.FleetTenant{ID: tenantID("db-" + name[len(r.prefix):]), Server: "db", Database: name})
	}
	for _, s := range r.schs {
		rows = append(rows, sqladapters.FleetTenant{ID: tenantID("sch-" + s), Server: "sch", Schema: s})
	}
	if err := r.store.PutTenants(ctx, pgxv5.WrapPool(r.ctl), rows); err != nil {
		return err
	}
	total := len(rows)
	last := time.Time{}
	for {
		held, looked := 0, 0
		for _, k := range r.kids {
			h, l, err := k.status(ctx)
			if err != nil {
				return err
			}
			held, looked = held+h, looked+l
		}
		all, _, err := r.conns(ctx, r.appPrefix())
		if err != nil {
			return err
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Printf("  %v: %d of %d tenants held, %d looked at, %d connections\n", time.Since(start).Round(time.Second), held, total, looked, all)
		}
		// Settled: every tenant looked at once, and only the doorbells'
		// connections left (the looks' close after MinHold idle).
		if held == total && looked == total && all <= 2*len(r.kids) {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return errors.New("the fleet did not settle within 10 minutes")
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Printf("fleet settled after %v\n", time.Since(start).Round(time.Second))
	return nil
}

// tenantID prefixes name with a hash of it. Instances claim tenants in
// ID order, so IDs grouped by kind would give the first instance every
// database tenant; applications' IDs rarely sort by server.
func tenantID(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%08x-%s", h.Sum32(), name)
}

// firstMessages publishes one message into each of a sample of idle
// tenants, one after the other, and returns their commit → arrival.
func (r *fleetRun) firstMessages(ctx context.Context) (dbs, schs []time.Duration, err error) {
	var ids []string
	pick := func(n int) []int {
		var is []int
		for i := range min(fleetSample, n) {
			is = append(is, i*n/min(fleetSample, n))
		}
		return is
	}
	for _, i := range pick(len(r.dbs)) {
		id, err := r.publishDB(ctx, r.dbs[i])
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
		time.Sleep(250 * time.Millisecond)
	}
	nDB := len(ids)
	for _, i := range pick(len(r.schs)) {
		id, err := r.publishSchema(ctx, r.schs[i])
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
		time.Sleep(250 * time.Millisecond)
	}
	if err := r.arr.waitAll(ctx, ids, time.Minute); err != nil {
		fmt.Printf("first messages: %v\n", err)
	}
	for i, id := range ids {
		l := r.arr.latency(id, time.Time{})
		if i < nDB {
			dbs = append(dbs, l)
		} else {
			schs = append(schs, l)
		}
	}
	fmt.Printf("first message of an idle tenant (idle %v+): databases %s; schemas %s\n", *fleetIdleFor, spreadMs(dbs), spreadMs(schs))
	return dbs, schs, nil
}

// spreadMs prints the quantiles of ds.
func spreadMs(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return "none"
	}
	if s[0] < 0 {
		n := 0
		for _, d := range s {
			if d < 0 {
				n++
			}
		}
		return fmt.Sprintf("%d of %d did not arrive", n, len(s))
	}
	return fmt.Sprintf("p50 %.1f ms, p99 %.1f ms, max %.1f ms (%d)", ms(percentile(s, 50)), ms(percentile(s, 99)), ms(s[len(s)-1]), len(s))
}

// busy runs -fleet-busy tenants at -fleet-busy-rate msg/s each, one
// message per transaction, for -duration, the others idle.
func (r *fleetRun) busy(ctx context.Context) (dbs, schs []time.Duration, err error) {
	d := orDefault(r.o.duration, 10*time.Second)
	nDB := *fleetBusyN / 2
	nSch := *fleetBusyN - nDB
	fmt.Printf("busy: %d database and %d schema tenants at %d msg/s each for %v\n", nDB, nSch, *fleetBusyRate, d)
	var mu sync.Mutex
	var ids, kinds []string
	var wg sync.WaitGroup
	errc := make(chan error, *fleetBusyN)
	run := func(kind string, db sqladapters.DB, dia sqladapters.Dialect, key string) {
		tick := time.NewTicker(time.Second / time.Duration(*fleetBusyRate))
		defer tick.Stop()
		end := time.Now().Add(d)
		for time.Now().Before(end) && ctx.Err() == nil {
			id, err := r.publishOne(ctx, db, dia, key)
			if err != nil {
				errc <- err
				return
			}
			mu.Lock()
			ids, kinds = append(ids, id), append(kinds, kind)
			mu.Unlock()
			<-tick.C
		}
	}
	// Tenants of the other end of the lists than the first-message
	// sample's.
	for i := range nDB {
		name := r.dbs[len(r.dbs)-1-i]
		cfg, err := pgxpool.ParseConfig(dbURL(r.o.pgURL, name, "mbbench_pub"))
		if err != nil {
			return nil, nil, err
		}
		cfg.MaxConns = 1
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		defer pool.Close()
		wg.Go(func() { run("db", pgxv5.WrapPool(pool), dbDialect, name) })
	}
	for i := range nSch {
		s := r.schs[len(r.schs)-1-i]
		wg.Go(func() {
			run("sch", pgxv5.WrapPool(r.schDB), postgres.MustNew(postgres.Options{Schema: s, WithoutInbox: true}), s)
		})
	}
	wg.Wait()
	select {
	case err := <-errc:
		return nil, nil, err
	default:
	}
	if err := r.arr.waitAll(ctx, ids, time.Minute); err != nil {
		fmt.Printf("busy: %v\n", err)
	}
	for i, id := range ids {
		if kinds[i] == "db" {
			dbs = append(dbs, r.arr.latency(id, time.Time{}))
		} else {
			schs = append(schs, r.arr.latency(id, time.Time{}))
		}
	}
	fmt.Printf("busy: databases %s; schemas %s\n", spreadMs(dbs), spreadMs(schs))
	return dbs, schs, nil
}

// add registers tenants whose outbox holds a message, one at a time,
// and returns the time from the registration to the message's arrival.
func (r *fleetRun) add(ctx context.Context) (dbs, schs []time.Duration, err error) {
	db := pgxv5.WrapPool(r.ctl)
	one := func(id string, row sqladapters.FleetTenant) (time.Duration, error) {
		t0 := time.Now()
		if err := r.store.PutTenants(ctx, db, []sqladapters.FleetTenant{row}); err != nil {
			return 0, err
		}
		if err := r.arr.waitAll(ctx, []string{id}, time.Minute); err != nil {
			fmt.Printf("add %s: %v\n", row.ID, err)
		}
		return r.arr.latency(id, t0), nil
	}
	for _, name := range r.adds {
		id, err := r.publishDB(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		l, err := one(id, sqladapters.FleetTenant{ID: "add-" + name[len(r.prefix):], Server: "db", Database: name})
		if err != nil {
			return nil, nil, err
		}
		dbs = append(dbs, l)
	}
	for _, s := range r.addSch {
		id, err := r.publishSchema(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		l, err := one(id, sqladapters.FleetTenant{ID: "add-" + s, Server: "sch", Schema: s})
		if err != nil {
			return nil, nil, err
		}
		schs = append(schs, l)
	}
	fmt.Printf("tenant added → its first message delivered: databases %s; schemas %s\n", spreadMs(dbs), spreadMs(schs))
	return dbs, schs, nil
}

// drain drains the single outbox with one forwarder, then registers the
// drain tenants and waits until the fleet delivered all their rows.
func (r *fleetRun) drain(ctx context.Context) (single, fleetRate float64, err error) {
	n := *fleetDrainN * *fleetBacklog
	fmt.Printf("drain: one forwarder, one outbox of %d rows\n", n)
	cfg, err := pgxpool.ParseConfig(dbURL(r.o.pgURL, r.single, "mbbench_single"))
	if err != nil {
		return 0, 0, err
	}
	// As many connections as a fleet tenant's handle may hold.
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	dest := newCounting(n)
	inv, err := millboxForward(ctx, forwarder.Config{
		DB: pgxv5.WrapPool(pool), Dialect: postgres.MustNew(postgres.Options{WithoutInbox: true}),
		Destination: dest, Logger: watermill.NopLogger{},
	}, dest.all)
	if err != nil {
		return 0, 0, err
	}
	single = inv * float64(n)
	fmt.Printf("drain: single forwarder %.0f msg/s; now %d tenants of %d rows through the fleet\n", single, len(r.drains), *fleetBacklog)
	var rows []sqladapters.FleetTenant
	for _, name := range r.drains {
		rows = append(rows, sqladapters.FleetTenant{ID: "drain-" + name[len(r.prefix):], Server: "db", Database: name})
	}
	before := r.arr.total.Load()
	t0 := time.Now()
	if err := r.store.PutTenants(ctx, pgxv5.WrapPool(r.ctl), rows); err != nil {
		return 0, 0, err
	}
	last := time.Now()
	for r.arr.total.Load()-before < int64(n) {
		if time.Since(t0) > 10*time.Minute {
			return 0, 0, fmt.Errorf("the fleet drained %d of %d rows in 10 minutes", r.arr.total.Load()-before, n)
		}
		if time.Since(last) > 5*time.Second {
			last = time.Now()
			fmt.Printf("  %v: %d of %d\n", time.Since(t0).Round(time.Second), r.arr.total.Load()-before, n)
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		}
	}
	fleetRate = float64(n) / time.Since(t0).Seconds()
	fmt.Printf("drain: fleet %.0f msg/s (from the registration to the last arrival)\n", fleetRate)
	return single, fleetRate, nil
}

// failover kills the first instance with SIGKILL, commits a message into
// a sample of its tenants right away and returns the time from the kill
// to each message's arrival.
func (r *fleetRun) failover(ctx context.Context) (dbs, schs []time.Duration, err error) {
	cat, err := r.store.Tenants(ctx, pgxv5.WrapPool(r.ctl))
	if err != nil {
		return nil, nil, err
	}
	victim := r.instanceID(0)
	var dbT []string
	var schT []string
	for _, t := range cat {
		if t.Owner != victim || strings.Contains(t.ID, "drain-") || strings.Contains(t.ID, "add-") {
			continue
		}
		if t.Database != "" && len(dbT) < fleetSample {
			dbT = append(dbT, t.Database)
		}
		if t.Schema != "" && len(schT) < fleetSample {
			schT = append(schT, t.Schema)
		}
	}
	fmt.Printf("failover: SIGKILL of instance %s; a message into %d of its database and %d of its schema tenants right after\n", victim, len(dbT), len(schT))
	kill := time.Now()
	r.kids[0].kill()
	var ids []string
	for _, name := range dbT {
		id, err := r.publishDB(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
	}
	for _, s := range schT {
		id, err := r.publishSchema(ctx, s)
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, id)
	}
	if err := r.arr.waitAll(ctx, ids, 5*time.Minute); err != nil {
		fmt.Printf("failover: %v\n", err)
		r.diagnose(ctx, dbT, ids[:len(dbT)])
	}
	for i, id := range ids {
		if i < len(dbT) {
			dbs = append(dbs, r.arr.latency(id, kill))
		} else {
			schs = append(schs, r.arr.latency(id, kill))
		}
	}
	fmt.Printf("failover: kill → delivery: databases %s; schemas %s\n", spreadMs(dbs), spreadMs(schs))
	return dbs, schs, nil
}

// diagnose prints, for each tenant database whose message did not
// arrive, its owner in the catalog and the rows left in its outbox.
func (r *fleetRun) diagnose(ctx context.Context, names, ids []string) {
	cat, err := r.store.Tenants(ctx, pgxv5.WrapPool(r.ctl))
	if err != nil {
		fmt.Printf("  catalog: %v\n", err)
		return
	}
	owner := map[string]string{}
	for _, t := range cat {
		owner[t.Database] = t.Owner
	}
	for i, name := range names {
		if r.arr.latency(ids[i], time.Time{}) >= 0 {
			continue
		}
		var n int
		var err error
		if err != nil {
			conn, cerr := pgx.Connect(ctx, dbURL(r.o.pgURL, name, "mbbench_admin"))
			if cerr == nil {
				err = conn.QueryRow(ctx, "SELECT count(*) FROM millbox_outbox").Scan(&n)
				conn.Close(ctx)
			}
		}
		fmt.Printf("  %s: owner %q, %d rows in its outbox (err %v)\n", name, owner[name], n, err)
	}
}
