package storetest

import (
	"database/sql"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The upkeep of a time-partitioned outbox (postgres.Options.Partitioned):
// partitions created ahead, old ones dropped once nothing pending is left
// in them, runs that overlap, and the rows, which survive all of it. The
// cases run where the dialect's outbox is partitioned and skip elsewhere.
var partitionCases = []testCase{
	{"PartitionsCreatedAhead", testPartitionsCreatedAhead},
	{"PartitionsDroppedAfterRetention", testPartitionsDroppedAfterRetention},
	{"PartitionMaintenanceConcurrent", testPartitionMaintenanceConcurrent},
}

// partitioned gives e a fresh migrated dialect of the partitioned layout
// and returns it with its options, or skips the case.
func (e *env) partitioned() (*postgres.Dialect, postgres.PartitionOptions) {
	e.t.Helper()
	d, ok := e.s.New(e.t).(*postgres.Dialect)
	if !ok || d.Options().Partitioned == nil {
		e.t.Skip("the outbox is not partitioned")
	}
	e.d = d
	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate")
	return d, *d.Options().Partitioned
}

// dbNow reads the database's clock, which routes rows to partitions.
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var s string
	rows, err := e.db.Query(e.ctx, `SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`)
	e.check(err, "read the clock")
	for rows.Next() {
		e.check(rows.Scan(&s), "scan the clock")
	}
	rows.Close()
	t, err := time.Parse(time.RFC3339Nano, s)
	e.check(err, "parse the clock")
	return t
}

// maintainAt runs the maintenance as if the clock read now.
func (e *env) maintainAt(d *postgres.Dialect, now time.Time) postgres.MaintenanceReport {
	e.t.Helper()
	rep, err := postgres.MaintainPartitions(e.ctx, e.db, d, now)
	e.check(err, "MaintainPartitions")
	return rep
}

// ranges lists the partitions by name, the default one first.
func (e *env) ranges(d *postgres.Dialect) []postgres.PartitionInfo {
	e.t.Helper()
	parts, err := postgres.ListPartitions(e.ctx, e.db, d)
	e.check(err, "ListPartitions")
	return parts
}

// infoNames and partNames return the sorted names of partitions.
func infoNames(ps []postgres.PartitionInfo) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

func partNames(ps []postgres.Partition) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// isPartition tells whether got, a relation's name as Postgres renders
// it (qualified where its schema is not on the search path), is the
// partition named name.
func isPartition(got, name string) bool {
	return got == name || strings.HasSuffix(got, "."+name)
}

// created places row id's creation at t, which moves it to the partition
// holding t.
func (e *env) created(id int64, t time.Time) {
	e.t.Helper()
	_, err := e.db.Exec(e.ctx, `UPDATE `+e.d.OutboxTable()+` SET created_at = $1 WHERE id = $2`, t, id)
	e.check(err, "move the row's creation")
}

// partitionOf names the partition of table holding row id, "" when none
// does.
func (e *env) partitionOf(table string, id int64) string {
	e.t.Helper()
	rows, err := e.db.Query(e.ctx, `SELECT tableoid::regclass::text FROM `+table+` WHERE id = $1`, id)
	e.check(err, "find the row's partition")
	defer rows.Close()
	var name string
	for rows.Next() {
		e.check(rows.Scan(&name), "scan the partition")
	}
	return name
}

// testPartitionsCreatedAhead checks that the migration creates the
// partition holding now and the Ahead after it, that maintenance later on
// creates the partitions of that time, consecutive ranges of Interval, once,
// and that the forwarder's entry (sqladapters.Maintainer) runs it on the
// database's clock.
func testPartitionsCreatedAhead(e *env) {
	d, opts := e.partitioned()
	now := e.dbNow()
	parts := e.ranges(d)
	if len(parts) != opts.Ahead+2 || !parts[0].Default {
		e.t.Fatalf("partitions after migrating: %+v, want the default one and %d more", parts, opts.Ahead+1)
	}
	for i, p := range parts[1:] {
		if p.To.Sub(p.From) != opts.Interval || (i == 0 && (now.Before(p.From) || !now.Before(p.To))) || (i > 0 && !p.From.Equal(parts[i].To)) {
			e.t.Fatalf("partition %d covers %v to %v: want consecutive ranges of %v from the one holding %v", i, p.From, p.To, opts.Interval, now)
		}
	}
	var m sqladapters.Maintainer = d
	if m.MaintainEvery() <= 0 {
		e.t.Fatalf("MaintainEvery %v on a partitioned outbox", m.MaintainEvery())
	}
	e.check(m.Maintain(e.ctx, e.db), "Maintain")
	if got := e.ranges(d); len(got) != len(parts) {
		t := infoNames(got)
		e.t.Fatalf("Maintain right after migrating changed the partitions to %v", t)
	}

	// Past the last partition: the one holding then and Ahead more.
	later := now.Add(time.Duration(opts.Ahead+1) * opts.Interval)
	rep := e.maintainAt(d, later)
	if len(rep.Created) != opts.Ahead+1 || len(rep.Kept)+len(rep.Blocked) != 0 || rep.Busy {
		e.t.Fatalf("maintenance %v later: %+v, want %d partitions created", later.Sub(now), rep, opts.Ahead+1)
	}
	for i, p := range rep.Created {
		if p.To.Sub(p.From) != opts.Interval || (i == 0 && (later.Before(p.From) || !later.Before(p.To))) || (i > 0 && !p.From.Equal(rep.Created[i-1].To)) {
			e.t.Fatalf("created %+v: want consecutive ranges of %v from the one holding %v", rep.Created, opts.Interval, later)
		}
	}
	listed := infoNames(e.ranges(d))
	for _, p := range rep.Created {
		if !slices.Contains(listed, p.Name) {
			e.t.Fatalf("created partition %s is not listed: %v", p.Name, listed)
		}
	}
	// Each is there: a row of its range lands in it.
	id := e.insert(msg("later", "k", 1))[0]
	e.created(id, rep.Created[1].From.Add(time.Minute))
	if got := e.partitionOf(d.OutboxTable(), id); !isPartition(got, rep.Created[1].Name) {
		e.t.Fatalf("a row of %v is in %q, want %s", rep.Created[1].From, got, rep.Created[1].Name)
	}
	if again := e.maintainAt(d, later); len(again.Created)+len(again.Dropped)+len(again.Blocked) != 0 {
		e.t.Fatalf("a second run changed %+v", again)
	}
	e.noneInUse("maintenance")
}

// testPartitionsDroppedAfterRetention checks that maintenance drops the
// partitions whose range ended more than Retain ago, with the kept rows
// of their ranges, and keeps a partition holding a pending row, which
// stays readable, until it is forwarded; dead letters live in a table of
// their own and survive.
func testPartitionsDroppedAfterRetention(e *env) {
	d, opts := e.partitioned()
	now := e.dbNow()
	old := now.Add(-opts.Retain - time.Duration(opts.Ahead+3)*opts.Interval)
	rep := e.maintainAt(d, old)
	if len(rep.Created) != opts.Ahead+1 {
		e.t.Fatalf("maintenance %v back: %+v, want %d partitions created", now.Sub(old), rep, opts.Ahead+1)
	}
	day := func(i int) time.Time { return rep.Created[i].From.Add(time.Minute) }
	ids := e.insert(msg("pending", "k", 1), msg("dead", "k", 1), msg("kept", "", 2))
	for i, id := range ids {
		e.created(id, day(i))
	}
	if got := e.partitionOf(d.OutboxTable(), ids[0]); !isPartition(got, rep.Created[0].Name) {
		e.t.Fatalf("the row of %v is in %q, want %s", day(0), got, rep.Created[0].Name)
	}
	e.fail(sqladapters.Failure{ID: ids[1], Attempts: 3, Error: "gone", Dead: true})
	_, err := d.CompleteForwarded(e.ctx, e.db, ids[2:], true)
	e.check(err, "CompleteForwarded keep")
	kept := e.table("_kept")
	if e.partitionOf(kept, ids[2]) == "" {
		e.t.Fatal("the kept row is in no kept partition")
	}

	rep2 := e.maintainAt(d, now)
	var wantDropped []string
	for _, p := range rep.Created[1:] {
		wantDropped = append(wantDropped, p.Name)
	}
	if got := partNames(rep2.Dropped); !slices.Equal(got, wantDropped) {
		e.t.Fatalf("dropped %v, want %v (report %+v)", got, wantDropped, rep2)
	}
	if len(rep2.Kept) != 1 || rep2.Kept[0].Name != rep.Created[0].Name || rep2.Kept[0].Pending != 1 {
		e.t.Fatalf("kept %+v, want %s with its pending row", rep2.Kept, rep.Created[0].Name)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, ids[:1]) {
		e.t.Fatalf("pending after retention: %v, want the row of the kept partition %v", got, ids[:1])
	}
	if n, err := d.CountDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}); err != nil || n != 1 {
		e.t.Fatalf("dead letters after retention: %d, %v; want the one", n, err)
	}
	if got := e.partitionOf(kept, ids[2]); got != "" {
		e.t.Fatalf("the kept row of a dropped range is still in %s", got)
	}
	listed := infoNames(e.ranges(d))
	for _, n := range wantDropped {
		if slices.Contains(listed, n) {
			e.t.Fatalf("%s is still listed: %v", n, listed)
		}
	}
	if again := e.maintainAt(d, now); len(again.Created)+len(again.Dropped)+len(again.Blocked) != 0 || len(again.Kept) != 1 {
		e.t.Fatalf("a second run: %+v, want only the partition with the pending row kept", again)
	}
	_, err = d.CompleteForwarded(e.ctx, e.db, ids[:1], false)
	e.check(err, "CompleteForwarded")
	if last := e.maintainAt(d, now); len(last.Dropped) != 1 || last.Dropped[0].Name != rep.Created[0].Name || len(last.Kept) != 0 {
		e.t.Fatalf("after forwarding its row: %+v, want %s dropped", last, rep.Created[0].Name)
	}
	e.noneInUse("maintenance")
}

// testPartitionMaintenanceConcurrent runs maintenance from several
// goroutines at once, some in transactions of their own, as the
// forwarder instances of a fleet do: none fails, each partition is
// created once, the others are told another run was busy, and the pending
// rows are all still there.
func testPartitionMaintenanceConcurrent(e *env) {
	d, opts := e.partitioned()
	ids := e.insert(msgs("m", 50)...)
	later := e.dbNow().Add(10 * opts.Interval)
	var (
		wg   sync.WaitGroup
		reps = make([]postgres.MaintenanceReport, 6)
		errs = make([]error, len(reps))
	)
	start := make(chan struct{})
	for i := range reps {
		wg.Go(func() {
			<-start
			var ex sqladapters.Executor = e.db
			var tx sqladapters.Tx
			if i%3 == 2 {
				var err error
				if tx, err = e.db.Begin(e.ctx, sql.TxOptions{}); err != nil {
					errs[i] = err
					return
				}
				ex = tx
			}
			reps[i], errs[i] = postgres.MaintainPartitions(e.ctx, ex, d, later)
			if tx != nil {
				if errs[i] == nil {
					errs[i] = tx.Commit(e.ctx)
				} else {
					sqladapters.Rollback(tx)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	var created []string
	for i, rep := range reps {
		if errs[i] != nil {
			e.t.Fatalf("run %d: %v", i, errs[i])
		}
		created = append(created, partNames(rep.Created)...)
	}
	slices.Sort(created)
	if len(created) != opts.Ahead+1 || len(slices.Compact(slices.Clone(created))) != len(created) {
		e.t.Fatalf("the runs created %v, want %d partitions, each once", created, opts.Ahead+1)
	}
	listed := infoNames(e.ranges(d))
	for _, n := range created {
		if !slices.Contains(listed, n) {
			e.t.Fatalf("%s is not listed: %v", n, listed)
		}
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 100}); !slices.Equal(got, ids) {
		e.t.Fatalf("%d rows pending after the runs, want the %d written", len(got), len(ids))
	}
	if rep := e.maintainAt(d, later); len(rep.Created) != 0 {
		t := partNames(rep.Created)
		e.t.Fatalf("a run after the concurrent ones created %v", t)
	}
	e.noneInUse("maintenance")
}
