package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// This file holds the maintenance of the partitioned layout (see
// partitioned.go): creating partitions ahead and dropping old ones.

// ErrNotPartitioned is returned by the partition functions for a dialect
// or an outbox table of the plain layout. It wraps
// sqladapters.ErrInvalidConfig.
var ErrNotPartitioned = fmt.Errorf("%w: the outbox is not partitioned (postgres.Options.Partitioned)", sqladapters.ErrInvalidConfig)

// Partition is one partition of the outbox, and of the kept rows' table
// over the same range (named with _k where the outbox's has _p, see
// PartitionOptions): the two are created and dropped together.
type Partition struct {
	// Name is the outbox partition's table name, unqualified and
	// unquoted.
	Name string
	// From and To bound the range of created_at the partition holds,
	// From included. Both are zero for the default partition and for a
	// partition whose bounds are not timestamps (MINVALUE, MAXVALUE).
	From, To time.Time
	// Default is true for the default partition.
	Default bool
}

// PartitionInfo is a Partition with its contents, as ListPartitions
// reports it.
type PartitionInfo struct {
	Partition
	// EstimatedRows is Postgres' estimate of the outbox partition's rows
	// (pg_class.reltuples), -1 before the partition was first vacuumed
	// or analyzed; KeptEstimatedRows is the same of the kept rows'
	// partition over the range.
	EstimatedRows, KeptEstimatedRows int64
	// Bytes is the size of the two partitions with their indexes.
	Bytes int64
	// Pending counts the rows waiting to be forwarded.
	Pending int64
}

// KeptPartition is a partition past retention that maintenance kept
// because it holds rows not yet forwarded.
type KeptPartition struct {
	Partition
	Pending int64
}

// MaintenanceReport says what one MaintainPartitions run did.
type MaintenanceReport struct {
	// Busy is true when another process was maintaining the same outbox;
	// this run then changed nothing.
	Busy bool
	// Created lists the partitions created.
	Created []Partition
	// Dropped lists the partitions detached and dropped by retention.
	Dropped []Partition
	// Kept lists the partitions past retention that hold pending rows;
	// they are dropped by a later run once those rows are gone.
	Kept []KeptPartition
	// Blocked lists ranges left without a partition because the default
	// partition holds rows in them (Postgres cannot attach a partition
	// over them). Their rows are forwarded from the default partition.
	Blocked []Partition
}

// ListPartitions lists the partitions of the outbox of d, the default
// partition first, then by range. It reads the catalog, so d's
// PartitionOptions do not matter; it fails with ErrNotPartitioned when
// the outbox is a plain table.
func ListPartitions(ctx context.Context, db sqladapters.Executor, dialect *Dialect) ([]PartitionInfo, error) {
	if dialect == nil {
		return nil, errors.New("millbox: ListPartitions: nil Dialect")
	}
	d := dialect.sql
	parts, err := listPartitions(ctx, db, d, true)
	if err != nil {
		return nil, err
	}
	counts, err := scanCounts(ctx, db, sqladapters.Query{SQL: `SELECT (SELECT relname::text FROM pg_class WHERE oid = o.tableoid), count(*)
FROM ` + d.outbox + ` o GROUP BY o.tableoid`})
	if err != nil {
		return nil, fmt.Errorf("millbox: count rows per partition: %w", d.ClassifyError(err))
	}
	for i := range parts {
		parts[i].Pending = counts[parts[i].Name]
	}
	return parts, nil
}

func scanCounts(ctx context.Context, db sqladapters.Executor, q sqladapters.Query) (map[string]int64, error) {
	rows, err := q.Query(ctx, db)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var n int64
		if err := rows.Scan(&name, &n); err != nil {
			return nil, err
		}
		out[name] = n
	}
	return out, rows.Err()
}

// listPartitions reads the partitions from the catalog; sizes says
// whether to read their size too.
func listPartitions(ctx context.Context, db sqladapters.Executor, d *sqlDialect, sizes bool) ([]PartitionInfo, error) {
	var kind string
	rows, err := db.Query(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, d.outbox)
	if err == nil {
		for rows.Next() {
			err = rows.Scan(&kind)
		}
		if err == nil {
			err = rows.Err()
		}
		rows.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("millbox: read the outbox table: %w", d.ClassifyError(err))
	}
	if kind != "p" {
		return nil, fmt.Errorf("%w: %s is a plain table", ErrNotPartitioned, d.outbox)
	}
	size := `0::bigint`
	if sizes {
		size = `pg_total_relation_size(c.oid) + coalesce(pg_total_relation_size(k.oid), 0)`
	}
	// The kept partition of a range is the kept table's child named after
	// the outbox partition (_k for _p, _kept_default for _default).
	rows, err = db.Query(ctx, `SELECT c.relname::text, b.expr = 'DEFAULT', r.m[1]::timestamptz, r.m[2]::timestamptz,
	c.reltuples::bigint, coalesce(k.reltuples::bigint, -1), `+size+`
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
CROSS JOIN LATERAL (SELECT regexp_match(b.expr, '^FOR VALUES FROM \(''([^'']+)''\) TO \(''([^'']+)''\)$') AS m) r
LEFT JOIN (pg_inherits ki JOIN pg_class k ON k.oid = ki.inhrelid) ON ki.inhparent = to_regclass($2)
	AND k.relname::text = CASE WHEN b.expr = 'DEFAULT' THEN $3 || '_kept_default' ELSE $3 || '_k' || substr(c.relname::text, length($3) + 3) END
WHERE i.inhparent = $1::regclass
ORDER BY b.expr <> 'DEFAULT', 3, 1`, d.outbox, d.kept, d.opts.OutboxTable)
	if err != nil {
		return nil, fmt.Errorf("millbox: list partitions: %w", d.ClassifyError(err))
	}
	defer rows.Close()
	var out []PartitionInfo
	for rows.Next() {
		var p PartitionInfo
		var from, to sql.NullTime
		if err := rows.Scan(&p.Name, &p.Default, &from, &to, &p.EstimatedRows, &p.KeptEstimatedRows, &p.Bytes); err != nil {
			return nil, fmt.Errorf("millbox: list partitions: %w", err)
		}
		p.From, p.To = from.Time.UTC(), to.Time.UTC()
		if !from.Valid || !to.Valid {
			p.From, p.To = time.Time{}, time.Time{}
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("millbox: list partitions: %w", err)
	}
	return out, nil
}

// MaintainPartitions keeps the partitions of d's outbox and kept rows: it
// creates the partitions holding now and the PartitionOptions.Ahead
// following ones, and detaches and drops the partitions whose range ended
// more than Retain before now, except those whose outbox partition holds
// a pending row, which it reports. It never touches the default
// partitions.
//
// It is idempotent and safe to run from several processes at once: a run
// takes an advisory lock for its duration, and a run that finds the lock
// taken returns at once with MaintenanceReport.Busy set. Each step (one
// partition created, or one detached and dropped) runs in its own short
// transaction under PartitionOptions.LockTimeout; a step that fails does
// not stop the others, and the run returns the report with every
// failure joined in its error.
//
// db is best a sqladapters.DB: the lock is then held by one transaction
// while each step runs in another, so the run needs two connections. Given
// a transaction, MaintainPartitions runs everything in it under savepoints,
// and the locks its steps take last until the caller ends it.
//
// now places the ranges; Maintain passes the database's clock, which is
// what routes rows.
func MaintainPartitions(ctx context.Context, db sqladapters.Executor, dialect *Dialect, now time.Time) (MaintenanceReport, error) {
	if dialect == nil {
		return MaintenanceReport{}, ErrNotPartitioned
	}
	return dialect.sql.maintainPartitions(ctx, db, now)
}

func (d *sqlDialect) maintainPartitions(ctx context.Context, db sqladapters.Executor, now time.Time) (MaintenanceReport, error) {
	var rep MaintenanceReport
	if d.opts.Partitioned == nil {
		return rep, ErrNotPartitioned
	}
	if db == nil {
		return rep, errors.New("millbox: MaintainPartitions: nil Executor")
	}
	opts := *d.opts.Partitioned
	r, err := d.startMaintenance(ctx, db, opts.LockTimeout)
	if err != nil || r == nil {
		rep.Busy = r == nil && err == nil
		return rep, err
	}
	defer r.finish(ctx)

	parts, err := listPartitions(ctx, r.ex, d, false)
	if err != nil {
		return rep, err
	}
	var errs []error
	first := opts.rangeStart(now)
	for i := range opts.Ahead + 1 {
		from := first.Add(time.Duration(i) * opts.Interval)
		p := Partition{Name: d.partitionName(from), From: from, To: from.Add(opts.Interval)}
		if overlaps(parts, p) {
			continue
		}
		err := r.step(ctx, func(ex sqladapters.Executor) error { return d.createPartition(ctx, ex, p) })
		switch {
		case err == nil:
			rep.Created = append(rep.Created, p)
		case sqlState(err) == "23514":
			// The default partition holds rows of this range.
			rep.Blocked = append(rep.Blocked, p)
		default:
			errs = append(errs, fmt.Errorf("millbox: create partition %s: %w", p.Name, d.ClassifyError(err)))
		}
	}

	cutoff := now.Add(-opts.Retain)
	prefix := d.opts.OutboxTable + "_p"
	for _, p := range parts {
		if p.Default || p.To.IsZero() || p.To.After(cutoff) || !strings.HasPrefix(p.Name, prefix) {
			continue
		}
		// A look without locks first, so that a partition kept for its
		// pending rows costs no lock on the outbox at every run.
		kept, err := d.unforwarded(ctx, r.ex, p.Partition)
		if err == nil && kept.Pending > 0 {
			rep.Kept = append(rep.Kept, kept)
			continue
		}
		if err == nil {
			err = r.step(ctx, func(ex sqladapters.Executor) error {
				var err error
				kept, err = d.dropPartition(ctx, ex, p.Partition)
				return err
			})
		}
		switch {
		case err == nil:
			rep.Dropped = append(rep.Dropped, p.Partition)
		case errors.Is(err, errKept):
			rep.Kept = append(rep.Kept, kept)
		default:
			errs = append(errs, fmt.Errorf("millbox: drop partition %s: %w", p.Name, d.ClassifyError(err)))
		}
	}
	return rep, errors.Join(errs...)
}

// errKept makes a drop step roll back its detach.
var errKept = errors.New("partition holds rows not yet forwarded")

// overlaps reports whether p's range meets a listed partition's.
func overlaps(parts []PartitionInfo, p Partition) bool {
	for _, q := range parts {
		if !q.To.IsZero() && q.From.Before(p.To) && p.From.Before(q.To) {
			return true
		}
	}
	return false
}

// createPartition creates p and its kept rows' partition as tables of
// their own and then attaches them: attaching locks the parent in SHARE
// UPDATE EXCLUSIVE mode, which lets inserts and reads go on, where CREATE
// TABLE ... PARTITION OF would lock out both. The default partition is
// locked while Postgres checks that it holds no row of p's range.
func (d *sqlDialect) createPartition(ctx context.Context, ex sqladapters.Executor, p Partition) error {
	bounds := ` FOR VALUES FROM (` + pgTimestamp(p.From) + `) TO (` + pgTimestamp(p.To) + `)`
	name, kept := d.qualify(p.Name), d.qualify(d.keptPartitionName(p.Name))
	stmts := []string{
		`CREATE TABLE ` + name + ` (LIKE ` + d.outbox + `) ` + partitionStorage,
		`ALTER TABLE ` + d.outbox + ` ATTACH PARTITION ` + name + bounds,
	}
	// The kept partition of the range outlives an outbox partition
	// dropped by hand: then it is there already.
	missing, err := queryString(ctx, ex, `SELECT (to_regclass($1) IS NULL)::text`, kept)
	if err != nil {
		return err
	}
	if missing == "true" {
		stmts = append(stmts,
			`CREATE TABLE `+kept+` (LIKE `+d.kept+`) `+partitionStorage,
			`ALTER TABLE `+d.kept+` ATTACH PARTITION `+kept+bounds)
	}
	for _, stmt := range stmts {
		if _, err := ex.Exec(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

// unforwarded counts the pending rows of p.
func (d *sqlDialect) unforwarded(ctx context.Context, ex sqladapters.Executor, p Partition) (KeptPartition, error) {
	k := KeptPartition{Partition: p}
	rows, err := ex.Query(ctx, `SELECT count(*) FROM `+d.qualify(p.Name))
	if err != nil {
		return k, err
	}
	defer rows.Close()
	for rows.Next() {
		if err := rows.Scan(&k.Pending); err != nil {
			return k, err
		}
	}
	return k, rows.Err()
}

// dropPartition detaches p, counts its pending rows again and drops it,
// with the kept rows' partition of its range, when there are none. Once
// detached, p is locked and out of the outbox, so no row can become
// pending in it between the count and the drop; a late insert of its
// range goes to the default partition. When rows remain it returns
// errKept, and the step's rollback attaches p again.
func (d *sqlDialect) dropPartition(ctx context.Context, ex sqladapters.Executor, p Partition) (KeptPartition, error) {
	name := d.qualify(p.Name)
	if _, err := ex.Exec(ctx, `ALTER TABLE `+d.outbox+` DETACH PARTITION `+name); err != nil {
		return KeptPartition{Partition: p}, err
	}
	k, err := d.unforwarded(ctx, ex, p)
	if err != nil {
		return k, err
	}
	if k.Pending > 0 {
		return k, errKept
	}
	if _, err = ex.Exec(ctx, `DROP TABLE `+name); err != nil {
		return k, err
	}
	// The kept partition may be missing (created by hand, or dropped
	// already): there is then nothing of it to drop.
	_, err = ex.Exec(ctx, `DROP TABLE IF EXISTS `+d.qualify(d.keptPartitionName(p.Name)))
	return k, err
}

// maintenance is one MaintainPartitions run: the executor it reads with
// and how it runs steps.
type maintenance struct {
	// ex reads outside of the steps: the database handle, never the
	// lock's transaction, whose locks would outlive the read and block
	// the steps.
	ex      sqladapters.Executor
	db      sqladapters.DB // nil when running inside the caller's transaction
	lockTx  sqladapters.Tx
	timeout string
	restore string // the caller's lock_timeout, restored at the end
}

// startMaintenance takes the maintenance lock of d's outbox; it returns
// nil and no error when another run holds it.
func (d *sqlDialect) startMaintenance(ctx context.Context, db sqladapters.Executor, timeout time.Duration) (*maintenance, error) {
	m := &maintenance{ex: db, timeout: strconv.FormatInt(timeout.Milliseconds(), 10) + "ms"}
	if b, ok := db.(sqladapters.DB); ok {
		tx, err := b.Begin(ctx, sql.TxOptions{})
		if err != nil {
			return nil, fmt.Errorf("millbox: begin partition maintenance: %w", err)
		}
		m.db, m.lockTx = b, tx
	} else {
		cur, err := queryString(ctx, db, `SELECT current_setting('lock_timeout')`)
		if err != nil {
			return nil, fmt.Errorf("millbox: begin partition maintenance: %w", err)
		}
		m.restore = cur
	}
	lockEx := m.ex
	if m.lockTx != nil {
		lockEx = m.lockTx
	}
	got, err := queryString(ctx, lockEx, `SELECT pg_try_advisory_xact_lock(hashtext($1))::text`,
		"millbox.partitions:"+d.opts.Schema+"."+d.opts.OutboxTable)
	if err == nil && got != "true" {
		m.finish(ctx)
		return nil, nil
	}
	if err != nil {
		m.finish(ctx)
		return nil, fmt.Errorf("millbox: take the partition maintenance lock: %w", d.ClassifyError(err))
	}
	return m, nil
}

// step runs fn in a transaction of its own, or under a savepoint of the
// caller's transaction, with the lock timeout set; it rolls back when fn
// fails.
func (m *maintenance) step(ctx context.Context, fn func(ex sqladapters.Executor) error) error {
	if m.db == nil {
		if _, err := m.ex.Exec(ctx, `SAVEPOINT millbox_maintain`); err != nil {
			return err
		}
		_, err := m.ex.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, m.timeout)
		if err == nil {
			err = fn(m.ex)
		}
		if err != nil {
			_, _ = m.ex.Exec(context.WithoutCancel(ctx), `ROLLBACK TO SAVEPOINT millbox_maintain`)
			return err
		}
		_, err = m.ex.Exec(ctx, `RELEASE SAVEPOINT millbox_maintain`)
		return err
	}
	tx, err := m.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true)`, m.timeout)
	if err == nil {
		err = fn(tx)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// finish releases the lock, or restores the caller's lock timeout.
func (m *maintenance) finish(ctx context.Context) {
	if m.lockTx != nil {
		sqladapters.Rollback(m.lockTx)
		return
	}
	if m.restore != "" {
		_, _ = m.ex.Exec(context.WithoutCancel(ctx), `SELECT set_config('lock_timeout', $1, true)`, m.restore)
	}
}

func queryString(ctx context.Context, ex sqladapters.Executor, q string, args ...any) (string, error) {
	rows, err := ex.Query(ctx, q, args...)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	var s string
	for rows.Next() {
		if err := rows.Scan(&s); err != nil {
			return "", err
		}
	}
	return s, rows.Err()
}

func sqlState(err error) string {
	var se sqlStater
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// Maintain runs MaintainPartitions with the database's clock, which is
// the one that routes rows to partitions. It does nothing for the plain
// layout, or when another process is maintaining the same outbox.
func (d *Dialect) Maintain(ctx context.Context, db sqladapters.Executor) error {
	return d.sql.maintain(ctx, db)
}

func (d *sqlDialect) maintain(ctx context.Context, db sqladapters.Executor) error {
	if d.opts.Partitioned == nil {
		return nil
	}
	now, err := queryString(ctx, db, `SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`)
	if err != nil {
		return fmt.Errorf("millbox: read the database clock: %w", d.ClassifyError(err))
	}
	t, err := time.Parse(time.RFC3339Nano, now)
	if err != nil {
		return fmt.Errorf("millbox: read the database clock: %w", err)
	}
	_, err = d.maintainPartitions(ctx, db, t)
	return err
}

// MaintainEvery returns how often the outbox needs Maintain: the
// PartitionOptions.MaintainEvery of the partitioned layout, and zero for
// the plain layout or when maintenance by the forwarder is turned off.
func (d *Dialect) MaintainEvery() time.Duration {
	p := d.sql.opts.Partitioned
	if p == nil || p.MaintainEvery < 0 {
		return 0
	}
	return p.MaintainEvery
}
