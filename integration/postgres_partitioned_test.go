package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// pgPartitionedEnv is pgEnv with the time-partitioned outbox layout.
func pgPartitionedEnv(t *testing.T) conformance.Env {
	env := pgEnv(t)
	pool := testenv.Postgres(t)
	db := env.DB
	env.NewDialect = func(t *testing.T) sqladapters.Dialect {
		return testenv.PostgresDialect(t, db, pool, postgres.Options{Partitioned: &postgres.PartitionOptions{}})
	}
	env.NewUnmigratedDialect = func(t *testing.T) sqladapters.Dialect {
		return postgres.MustNew(postgres.Options{
			OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_"),
			Partitioned: &postgres.PartitionOptions{},
		})
	}
	return env
}

func TestPostgresPartitionedOutboxConformance(t *testing.T) {
	conformance.Outbox(t, pgPartitionedEnv(t))
}

func TestPostgresPartitionedForwarderConformance(t *testing.T) {
	conformance.Forwarder(t, pgPartitionedEnv(t))
}

// pgPart is a partitioned installation in a schema of its own.
type pgPart struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	db   sqladapters.DB
	d    *postgres.Dialect
}

func newPgPart(t *testing.T, opts postgres.PartitionOptions) *pgPart {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	return &pgPart{
		t: t, ctx: testenv.Ctx(t, 2*time.Minute), pool: pool, db: db,
		d: testenv.PostgresDialect(t, db, pool, postgres.Options{Partitioned: &opts}),
	}
}

// now reads the database's clock, which routes rows.
func (p *pgPart) now() time.Time {
	p.t.Helper()
	var now time.Time
	if err := p.pool.QueryRow(p.ctx, `SELECT now()`).Scan(&now); err != nil {
		p.t.Fatal(err)
	}
	return now.UTC()
}

func (p *pgPart) maintain(now time.Time) postgres.MaintenanceReport {
	p.t.Helper()
	rep, err := postgres.MaintainPartitions(p.ctx, p.db, p.d, now)
	if err != nil {
		p.t.Fatalf("maintain at %v: %v", now, err)
	}
	if rep.Busy {
		p.t.Fatalf("maintain at %v: busy with nobody else maintaining", now)
	}
	return rep
}

func (p *pgPart) list() []postgres.PartitionInfo {
	p.t.Helper()
	parts, err := postgres.ListPartitions(p.ctx, p.db, p.d)
	if err != nil {
		p.t.Fatal(err)
	}
	return parts
}

// insertAt writes one pending row created at created and returns the
// partition it landed in.
func (p *pgPart) insertAt(created time.Time) (int64, string) {
	p.t.Helper()
	var id int64
	var part string
	err := p.pool.QueryRow(p.ctx, `INSERT INTO `+p.d.OutboxTable()+` (topic, uuid, payload, created_at)
VALUES ('t', gen_random_uuid()::text, '', $1) RETURNING id, tableoid::regclass::text`, created).Scan(&id, &part)
	if err != nil {
		p.t.Fatal(err)
	}
	return id, strings.Trim(part[strings.LastIndex(part, ".")+1:], `"`)
}

// partitionOf returns the partition of table holding row id, "" when
// there is no such row.
func (p *pgPart) partitionOf(table string, id int64) string {
	p.t.Helper()
	var part string
	err := p.pool.QueryRow(p.ctx, `SELECT tableoid::regclass::text FROM `+table+` WHERE id = $1`, id).Scan(&part)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		p.t.Fatal(err)
	}
	return strings.Trim(part[strings.LastIndex(part, ".")+1:], `"`)
}

func partitionNames(parts []postgres.PartitionInfo) []string {
	out := []string{}
	for _, p := range parts {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func rangeNames(ps []postgres.Partition) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func keptNames(ps []postgres.KeptPartition) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// dayName is the partition of the day holding t, with daily partitions.
func dayName(d *postgres.Dialect, t time.Time) string {
	return d.Options().OutboxTable + t.UTC().Truncate(24*time.Hour).Format("_p20060102_1504")
}

func TestPostgresPartitionedLayout(t *testing.T) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	ctx := testenv.Ctx(t, time.Minute)
	opts := postgres.PartitionOptions{}
	d := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool), Partitioned: &opts})
	migrateTwice(t, ctx, db, d)
	p := &pgPart{t: t, ctx: ctx, pool: pool, db: db, d: d}

	var kind, pk string
	if err := pool.QueryRow(ctx, `SELECT c.relkind::text, (SELECT string_agg(a.attname, ',' ORDER BY k.n)
	FROM pg_index i CROSS JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, n)
	JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
	WHERE i.indrelid = c.oid AND i.indisprimary)
FROM pg_class c WHERE c.oid = $1::regclass`, d.OutboxTable()).Scan(&kind, &pk); err != nil {
		t.Fatal(err)
	}
	if kind != "p" || pk != "id,created_at" {
		t.Fatalf("outbox relkind %q, primary key (%s); want a partitioned table keyed (id,created_at)", kind, pk)
	}

	// The migration made the default partition, the current one and the
	// ones ahead, named as maintenance names them.
	now := p.now()
	parts := p.list()
	want := []string{d.Options().OutboxTable + "_default"}
	for i := range 4 {
		want = append(want, dayName(d, now.Add(time.Duration(i)*24*time.Hour)))
	}
	slices.Sort(want)
	if got := partitionNames(parts); !slices.Equal(got, want) {
		t.Fatalf("partitions after migrating: %v, want %v", got, want)
	}
	if !parts[0].Default || parts[1].From.IsZero() || parts[1].To.Sub(parts[1].From) != 24*time.Hour {
		t.Fatalf("partitions listed as %+v", parts)
	}
	if rep := p.maintain(now); len(rep.Created)+len(rep.Dropped)+len(rep.Kept)+len(rep.Blocked) != 0 {
		t.Fatalf("maintenance right after migrating changed %+v", rep)
	}

	// Same columns as the plain layout.
	plain := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool)})
	if err := sqladapters.Migrate(ctx, db, plain); err != nil {
		t.Fatal(err)
	}
	if a, b := outboxColumns(t, ctx, pool, plain), outboxColumns(t, ctx, pool, d); a != b {
		t.Fatalf("partitioned outbox columns:\n%s\nplain:\n%s", b, a)
	}

	// The printed script builds the same layout in another schema.
	other := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool), Partitioned: &opts})
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+other.Schema()+`"`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, sqladapters.MigrationSQL(other)); err != nil {
		t.Fatalf("printed SQL does not apply: %v", err)
	}
	if got := partitionNames((&pgPart{t: t, ctx: ctx, pool: pool, db: db, d: other}).list()); !slices.Equal(got, want) {
		t.Fatalf("printed SQL made partitions %v, want %v", got, want)
	}

	// The plain layout has no partitions to list or maintain.
	if _, err := postgres.ListPartitions(ctx, db, plain); !errors.Is(err, postgres.ErrNotPartitioned) {
		t.Fatalf("listing the partitions of a plain outbox: %v", err)
	}
	if _, err := postgres.MaintainPartitions(ctx, db, plain, now); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("maintaining a plain dialect: %v", err)
	}
	if err := plain.Maintain(ctx, db); err != nil {
		t.Fatalf("Maintain of the plain layout: %v", err)
	}
}

func outboxColumns(t *testing.T, ctx context.Context, pool *pgxpool.Pool, d *postgres.Dialect) string {
	t.Helper()
	var s string
	err := pool.QueryRow(ctx, `SELECT string_agg(column_name || ':' || data_type || ':' || is_nullable || ':' || coalesce(column_default, '') || ':' || is_identity, E'\n' ORDER BY ordinal_position)
FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2`, d.Schema(), d.Options().OutboxTable).Scan(&s)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPostgresPartitionRetention keeps partitions holding pending rows
// past retention, drops the others with the kept rows of their ranges,
// and drops the kept ones once their rows are gone. Dead letters live in
// a table of their own and hold no partition back; requeued after their
// range was dropped, they go to the default partition.
func TestPostgresPartitionRetention(t *testing.T) {
	p := newPgPart(t, postgres.PartitionOptions{})
	d := p.d
	now := p.now()
	old := now.Add(-30 * 24 * time.Hour)
	rep := p.maintain(old)
	if len(rep.Created) != 4 || len(rep.Dropped) != 0 {
		t.Fatalf("maintenance a month back: %+v, want 4 partitions created", rep)
	}
	day := func(i int) time.Time {
		return old.Truncate(24 * time.Hour).Add(time.Duration(i)*24*time.Hour + time.Hour)
	}
	pendingID, part := p.insertAt(day(0))
	if part != dayName(d, day(0)) {
		t.Fatalf("row of %v landed in %s", day(0), part)
	}
	deadID, _ := p.insertAt(day(1))
	if _, err := d.RecordFailure(p.ctx, p.db, sqladapters.Failure{ID: deadID, Attempts: 3, Error: "x", Dead: true}); err != nil {
		t.Fatal(err)
	}
	keptID, _ := p.insertAt(day(2))
	if _, err := d.CompleteForwarded(p.ctx, p.db, []int64{keptID}, true); err != nil {
		t.Fatal(err)
	}
	kept := d.Tables()[6]
	wantPart := d.Options().OutboxTable + day(2).UTC().Truncate(24*time.Hour).Format("_k20060102_1504")
	if got := p.partitionOf(kept, keptID); got != wantPart {
		t.Fatalf("the kept row is in %q, want the kept partition of its range %s", got, wantPart)
	}
	// day 3 stays empty.

	rep = p.maintain(now)
	wantDropped := []string{dayName(d, day(1)), dayName(d, day(2)), dayName(d, day(3))}
	wantKept := []string{dayName(d, day(0))}
	if got := rangeNames(rep.Dropped); !slices.Equal(got, wantDropped) {
		t.Fatalf("dropped %v, want %v (report %+v)", got, wantDropped, rep)
	}
	if got := keptNames(rep.Kept); !slices.Equal(got, wantKept) || rep.Kept[0].Pending != 1 {
		t.Fatalf("kept %+v, want %v with its pending row", rep.Kept, wantKept)
	}
	listed := partitionNames(p.list())
	for _, n := range wantDropped {
		if slices.Contains(listed, n) {
			t.Fatalf("%s still listed: %v", n, listed)
		}
	}
	var pending int64
	for _, pi := range p.list() {
		pending += pi.Pending
	}
	if pending != 1 {
		t.Fatalf("listed %d pending rows, want 1", pending)
	}
	if got := p.partitionOf(kept, keptID); got != "" {
		t.Fatalf("the kept row of a dropped range is still in %s", got)
	}
	var keptParts int
	if err := p.pool.QueryRow(p.ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = $1::regclass`, kept).Scan(&keptParts); err != nil || keptParts != len(listed) {
		t.Fatalf("%d kept partitions, %v; want one per outbox partition (%d)", keptParts, err, len(listed))
	}
	if n, err := d.CountDeadLetters(p.ctx, p.db, sqladapters.DeadLetterFilter{}); err != nil || n != 1 {
		t.Fatalf("dead letters after retention: %d, %v; want the one", n, err)
	}

	// Idempotent.
	rep = p.maintain(now)
	if len(rep.Created)+len(rep.Dropped)+len(rep.Blocked) != 0 || !slices.Equal(keptNames(rep.Kept), wantKept) {
		t.Fatalf("second run: %+v", rep)
	}

	// Requeued after its range was dropped, the dead letter waits in the
	// default partition. Once the rows are forwarded the partition goes.
	if n, err := d.RequeueDeadLetters(p.ctx, p.db, []int64{deadID}); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	if got := p.partitionOf(d.OutboxTable(), deadID); got != d.Options().OutboxTable+"_default" {
		t.Fatalf("the requeued row is in %q, want the default partition", got)
	}
	if _, err := d.CompleteForwarded(p.ctx, p.db, []int64{deadID, pendingID}, false); err != nil {
		t.Fatal(err)
	}
	rep = p.maintain(now)
	if got := rangeNames(rep.Dropped); !slices.Equal(got, wantKept) || len(rep.Kept) != 0 {
		t.Fatalf("after forwarding: %+v, want %v dropped", rep, wantKept)
	}
	if got := len(p.list()); got != 5 {
		t.Fatalf("%d partitions left, want the default, the current one and 3 ahead", got)
	}
}

// TestPostgresPartitionMaintenanceConcurrent runs maintenance from several
// processes at once: none fails, and each partition is created once.
func TestPostgresPartitionMaintenanceConcurrent(t *testing.T) {
	p := newPgPart(t, postgres.PartitionOptions{})
	later := p.now().Add(10 * 24 * time.Hour)
	var wg sync.WaitGroup
	reps := make([]postgres.MaintenanceReport, 6)
	errs := make([]error, len(reps))
	for i := range reps {
		wg.Go(func() {
			var db sqladapters.Executor = p.db
			var tx sqladapters.Tx
			if i%3 == 2 {
				// Some run inside a transaction of their own.
				var err error
				if tx, err = p.db.Begin(p.ctx, sql.TxOptions{}); err != nil {
					errs[i] = err
					return
				}
				db = tx
			}
			reps[i], errs[i] = postgres.MaintainPartitions(p.ctx, db, p.d, later)
			if tx != nil {
				if errs[i] == nil {
					errs[i] = tx.Commit(p.ctx)
				} else {
					sqladapters.Rollback(tx)
				}
			}
		})
	}
	wg.Wait()
	var created []string
	for i, rep := range reps {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		created = append(created, rangeNames(rep.Created)...)
	}
	slices.Sort(created)
	var want []string
	for i := range 4 {
		want = append(want, dayName(p.d, later.Add(time.Duration(i)*24*time.Hour)))
	}
	if !slices.Equal(created, want) {
		t.Fatalf("created %v, want each of %v once", created, want)
	}
	listed := partitionNames(p.list())
	for _, n := range want {
		if !slices.Contains(listed, n) {
			t.Fatalf("%s missing from %v", n, listed)
		}
	}
	if rep := p.maintain(later); len(rep.Created) != 0 {
		t.Fatalf("a run after the concurrent ones created %v", rangeNames(rep.Created))
	}
}

// TestPostgresPartitionDefaultCatchesStrays writes a row whose time has no
// partition: it lands in the default partition, blocks that range's
// partition until it is forwarded, and is forwarded like any other.
func TestPostgresPartitionDefaultCatchesStrays(t *testing.T) {
	p := newPgPart(t, postgres.PartitionOptions{})
	far := p.now().Add(60 * 24 * time.Hour)
	_, part := p.insertAt(far)
	if part != p.d.Options().OutboxTable+"_default" {
		t.Fatalf("row without a partition landed in %s", part)
	}
	rep := p.maintain(far)
	if got := rangeNames(rep.Blocked); !slices.Equal(got, []string{dayName(p.d, far)}) || len(rep.Created) != 3 {
		t.Fatalf("maintenance over a stray row: %+v", rep)
	}

	rec := conformance.NewRecorder()
	conformance.StartForwarder(t, forwarder.Config{
		DB:                  p.db,
		Dialect:             p.d,
		Destination:         rec,
		DelayedPollInterval: 50 * time.Millisecond,
		Logger:              testenv.Logger(t),
		Source:              forwarder.Polling{PollInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second, Partitions: 4},
	})
	rec.WaitFor(t, 1, 20*time.Second)
	conformance.WaitFor(t, "the stray row to be deleted", func() bool {
		return len(conformance.ReadPending(t, p.ctx, p.db, p.d)) == 0
	})
	// The forwarder maintains the table too (at start and every
	// MaintainEvery): wait for a turn of our own.
	for {
		var err error
		rep, err = postgres.MaintainPartitions(p.ctx, p.db, p.d, far)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Busy {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := rangeNames(rep.Created); !slices.Equal(got, []string{dayName(p.d, far)}) || len(rep.Blocked) != 0 {
		t.Fatalf("maintenance after forwarding the stray row: %+v", rep)
	}
}

// TestPostgresPartitionMaintainer drives maintenance the way a forwarder
// does, through sqladapters.Maintainer.
func TestPostgresPartitionMaintainer(t *testing.T) {
	p := newPgPart(t, postgres.PartitionOptions{Interval: time.Hour, Ahead: 2, Retain: 2 * time.Hour})
	var m sqladapters.Maintainer = p.d
	if m.MaintainEvery() != 15*time.Minute {
		t.Fatalf("MaintainEvery %v", m.MaintainEvery())
	}
	if _, err := p.pool.Exec(p.ctx, `DROP TABLE "`+p.d.Schema()+`"."`+p.d.Options().OutboxTable+p.now().Truncate(time.Hour).Add(2*time.Hour).Format("_p20060102_1504")+`"`); err != nil {
		t.Fatal(err)
	}
	before := len(p.list())
	if err := m.Maintain(p.ctx, p.db); err != nil {
		t.Fatal(err)
	}
	if after := len(p.list()); after != before+1 {
		t.Fatalf("Maintain left %d partitions, want %d", after, before+1)
	}
	// Inside a transaction, and with the caller's lock timeout restored.
	tx, err := p.db.Begin(p.ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	if _, err := tx.Exec(p.ctx, `SET LOCAL lock_timeout = '7s'`); err != nil {
		t.Fatal(err)
	}
	if err := m.Maintain(p.ctx, tx); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(p.ctx, `SELECT current_setting('lock_timeout')`)
	if err != nil {
		t.Fatal(err)
	}
	var lt string
	for rows.Next() {
		_ = rows.Scan(&lt)
	}
	rows.Close()
	if lt != "7s" {
		t.Fatalf("lock_timeout after maintenance in the caller's transaction: %q", lt)
	}
}

// BenchmarkPostgresOutboxLayouts runs the forwarder's statements on each
// layout: insert a batch, read it as pending, delete it by id. The
// partitioned outbox has its default retention's worth of partitions (a
// week of daily ones, three ahead and the default), so lookups by id probe
// each of them.
//
//	go test ./integration -run '^$' -bench PostgresOutboxLayouts -benchtime 200x
func BenchmarkPostgresOutboxLayouts(b *testing.B) {
	const batch = 1000
	for _, layout := range []struct {
		name string
		opts *postgres.PartitionOptions
	}{{"plain", nil}, {"partitioned", &postgres.PartitionOptions{}}} {
		b.Run(layout.name, func(b *testing.B) {
			pool := testenv.Postgres(b)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(b, db, pool, postgres.Options{Partitioned: layout.opts})
			ctx := context.Background()
			if layout.opts != nil {
				var now time.Time
				if err := pool.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
					b.Fatal(err)
				}
				if _, err := postgres.MaintainPartitions(ctx, db, d, now.Add(-8*24*time.Hour)); err != nil {
					b.Fatal(err)
				}
				if _, err := postgres.MaintainPartitions(ctx, db, d, now.Add(-4*24*time.Hour)); err != nil {
					b.Fatal(err)
				}
			}
			msgs := make([]sqladapters.OutboxMessage, batch)
			for i := range msgs {
				msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: "u", Payload: make([]byte, 256), Metadata: []byte(`{}`), Key: "k" + string(rune('a'+i%16)), KeyHash: int32(i % 16)}
			}
			ids := make([]int64, 0, batch)
			b.ResetTimer()
			for range b.N {
				if err := d.InsertOutbox(ctx, db, msgs); err != nil {
					b.Fatal(err)
				}
				rows, err := d.ReadPending(ctx, db, sqladapters.PendingQuery{Partitions: 16, Limit: batch}, false)
				if err != nil {
					b.Fatal(err)
				}
				ids = ids[:0]
				for _, r := range rows {
					ids = append(ids, r.ID)
				}
				if len(ids) != batch {
					b.Fatalf("read %d pending rows, want %d", len(ids), batch)
				}
				if _, err := d.CompleteForwarded(ctx, db, ids, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}

// TestPostgresPartitionMaintenanceYieldsToWriters runs maintenance while a
// business transaction that wrote to the outbox stays open: partitions are
// still created (attaching does not wait for writers), and the drops,
// which must lock the outbox, give up after LockTimeout instead of
// queueing every writer behind them; the next run does them.
func TestPostgresPartitionMaintenanceYieldsToWriters(t *testing.T) {
	p := newPgPart(t, postgres.PartitionOptions{LockTimeout: 200 * time.Millisecond})
	now := p.now()
	if rep := p.maintain(now.Add(-30 * 24 * time.Hour)); len(rep.Created) != 4 {
		t.Fatalf("old partitions: %+v", rep)
	}
	tx, err := p.db.Begin(p.ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	if err := p.d.InsertOutbox(p.ctx, tx, []sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte{}, Metadata: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := postgres.MaintainPartitions(p.ctx, p.db, p.d, now.Add(5*24*time.Hour))
	if err == nil || !strings.Contains(err.Error(), "lock timeout") || len(rep.Dropped) != 0 || len(rep.Created) != 4 {
		t.Fatalf("maintenance next to an open writer: %+v, %v; want 4 created and the drops timed out", rep, err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("maintenance waited %v", took)
	}
	// A writer arriving now is not blocked.
	if _, err := p.pool.Exec(p.ctx, `INSERT INTO `+p.d.OutboxTable()+` (topic, uuid, payload) VALUES ('t', 'v', '')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(p.ctx); err != nil {
		t.Fatal(err)
	}
	if rep := p.maintain(now.Add(5 * 24 * time.Hour)); len(rep.Dropped) != 4 {
		t.Fatalf("maintenance once the writer committed: %+v", rep)
	}
}
