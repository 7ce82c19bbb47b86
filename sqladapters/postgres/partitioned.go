package postgres

// This file holds the time-partitioned outbox layout: its options and the
// statements of its first migration. Maintenance (creating partitions
// ahead, dropping old ones) is in maintain.go.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const (
	// DefaultPartitionInterval is the range of one partition when
	// PartitionOptions leaves Interval zero.
	DefaultPartitionInterval = 24 * time.Hour
	// DefaultPartitionsAhead is the number of partitions kept created
	// after the current one when PartitionOptions leaves Ahead zero.
	DefaultPartitionsAhead = 3
	// DefaultPartitionRetain is how long a partition is kept after its
	// range ends when PartitionOptions leaves Retain zero.
	DefaultPartitionRetain = 7 * 24 * time.Hour
	// DefaultPartitionLockTimeout bounds each table-lock wait of
	// maintenance when PartitionOptions leaves LockTimeout zero.
	DefaultPartitionLockTimeout = 2 * time.Second
	// MaxPartitions bounds the partitions one configuration keeps (the
	// retained, current and ahead ones): each is a table whose index every
	// lookup by id probes.
	MaxPartitions = 400
	// maxMaintainEvery caps the default maintenance period.
	maxMaintainEvery = time.Hour
)

// partitionOrigin is the instant partition ranges are counted from: a
// Monday at midnight UTC, so daily partitions start at midnight UTC and
// weekly ones on Mondays.
var partitionOrigin = time.Date(2000, 1, 3, 0, 0, 0, 0, time.UTC)

// PartitionOptions turns on the time-partitioned outbox layout (see
// Options.Partitioned). Its zero value is daily partitions, three ahead,
// kept seven days. The layout needs PostgreSQL 12 or later.
//
// With Options.Partitioned set, the outbox is a declarative partitioned
// table, PARTITION BY RANGE (created_at), with one partition per Interval
// named <outbox>_pYYYYMMDD_HHMM after the UTC start of its range, and a
// default partition <outbox>_default. The primary key is (id, created_at),
// since Postgres requires the partition key in every unique constraint; id
// still comes from one identity sequence and stays unique. The retry
// index is a partitioned index, present on every partition. The table of
// forwarded rows kept for audit is partitioned alike: for every outbox
// partition <outbox>_p… there is <outbox>_k… over the same range (and
// <outbox>_kept_default), created and dropped with it. Dead letters live
// in a plain table, <outbox>_dead. Statements that find rows by id alone
// (completing, failing, keeping and requeueing rows) cannot prune
// partitions: they probe the primary-key index of each partition, which
// stays cheap while the number of partitions is a few dozen (see
// MaxPartitions).
//
// The default partition takes every row whose created_at has no partition,
// so an insert never fails because maintenance did not run in time: a
// missed maintenance run must never refuse a business transaction nor lose
// its message. Rows in the default partition are forwarded like any other.
// A range whose rows sit in the default partition cannot get a partition
// of its own (Postgres refuses to attach it); maintenance reports it as
// blocked and those rows stay where they are. A dead letter requeued after
// its range was dropped goes there too. The default partitions are never
// dropped: forwarded rows kept there are removed by row deletes
// (ops.Ops.Prune, `millbox prune`).
//
// Maintenance drops a range's partitions once the whole range is older
// than Retain, and never while its outbox partition holds a pending row
// (it reports those instead and drops them by a later run once their rows
// are forwarded). With KeepForwarded, forwarded rows are therefore removed
// by dropping whole partitions, not by row deletes: no dead tuples, no
// vacuum work, no index bloat. Without KeepForwarded the forwarder still
// deletes rows as it publishes them, and retention drops the emptied
// partitions.
//
// Choose the partitioned layout when forwarded rows are kept for audit or
// replay, or when the outbox may hold tens of millions of rows after an
// outage: old data leaves by DROP TABLE instead of DELETE and vacuum.
// The plain layout is simpler and needs no maintenance; it suits outboxes
// whose rows are deleted as they are forwarded.
//
// Migrations create the layout of a new installation only: an existing
// plain outbox is not converted. To move, create the partitioned layout
// under another outbox table name (or schema), point publishers at it,
// keep a forwarder running on the old dialect until its outbox is empty
// (its dead letters requeued or discarded), then stop that forwarder and
// drop the old tables. Per-key order holds within one table only: while
// both forwarders run, a key's new messages may overtake its old ones.
// Where that matters, switch publishers over once the old backlog is
// empty, or pause them for the moment the old forwarder needs to drain it.
type PartitionOptions struct {
	// Interval is the range of created_at one partition covers, a whole
	// number of hours. Ranges are counted from Monday 2000-01-03 00:00
	// UTC: 24h partitions start at midnight UTC, 168h ones on Mondays.
	// Defaults to DefaultPartitionInterval (24h).
	Interval time.Duration
	// Ahead is how many partitions after the current one maintenance
	// keeps created, so that inserts find their partition although
	// maintenance runs late. At least 1. Defaults to
	// DefaultPartitionsAhead (3).
	Ahead int
	// Retain is how long a partition is kept after the end of its range;
	// then maintenance drops it, unless it holds a pending row.
	// At least Interval. Defaults to DefaultPartitionRetain (7 days), or
	// Interval when that is longer.
	Retain time.Duration
	// MaintainEvery is how often a forwarder runs maintenance (see
	// sqladapters.Maintainer). Negative turns that off: run
	// MaintainPartitions or `millbox partitions maintain` on a schedule
	// instead. Shorter than Ahead × Interval, or partitions run out
	// between runs. Defaults to a quarter of Interval, at most one hour.
	MaintainEvery time.Duration
	// LockTimeout bounds each wait of maintenance for a table lock.
	// Attaching and detaching a partition lock the outbox briefly; a long
	// transaction on it would otherwise make them queue and block every
	// writer behind them. A step that times out is retried by the next
	// run. Defaults to DefaultPartitionLockTimeout (2s).
	LockTimeout time.Duration
}

// withDefaults returns o with its zero fields set.
func (o PartitionOptions) withDefaults() PartitionOptions {
	if o.Interval == 0 {
		o.Interval = DefaultPartitionInterval
	}
	if o.Ahead == 0 {
		o.Ahead = DefaultPartitionsAhead
	}
	if o.Retain == 0 {
		o.Retain = max(DefaultPartitionRetain, o.Interval)
	}
	if o.MaintainEvery == 0 {
		o.MaintainEvery = min(o.Interval/4, maxMaintainEvery)
	}
	if o.LockTimeout == 0 {
		o.LockTimeout = DefaultPartitionLockTimeout
	}
	return o
}

// Validate checks options with defaults applied; its errors wrap
// sqladapters.ErrInvalidConfig and name the field and the rule.
func (o PartitionOptions) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: postgres.PartitionOptions.%s", sqladapters.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Interval < time.Hour || o.Interval%time.Hour != 0:
		return bad("Interval %v must be a whole number of hours, at least 1h", o.Interval)
	case o.Ahead < 1:
		return bad("Ahead %d must be at least 1", o.Ahead)
	case o.Retain < o.Interval:
		return bad("Retain %v must be at least Interval %v", o.Retain, o.Interval)
	case o.LockTimeout <= 0:
		return bad("LockTimeout %v must be positive", o.LockTimeout)
	case o.MaintainEvery > 0 && o.MaintainEvery >= time.Duration(o.Ahead)*o.Interval:
		return bad("MaintainEvery %v must be shorter than Ahead × Interval (%v), or partitions run out between runs", o.MaintainEvery, time.Duration(o.Ahead)*o.Interval)
	}
	if n := o.Retain/o.Interval + 2 + time.Duration(o.Ahead); n > MaxPartitions {
		return bad("Retain %v, Interval %v and Ahead %d keep %d partitions, more than %d: choose a longer Interval", o.Retain, o.Interval, o.Ahead, n, MaxPartitions)
	}
	return nil
}

// rangeStart returns the start of the partition range holding t.
func (o PartitionOptions) rangeStart(t time.Time) time.Time {
	d := t.Sub(partitionOrigin)
	n := d / o.Interval
	if d%o.Interval < 0 {
		n--
	}
	return partitionOrigin.Add(n * o.Interval)
}

// partitionSuffix is the Go layout of the suffix naming a partition after
// the UTC start of its range; partitionSuffixSQL is the same for to_char.
const (
	partitionSuffix    = "_p20060102_1504"
	partitionSuffixSQL = `'_p' || to_char(s AT TIME ZONE 'UTC', 'YYYYMMDD_HH24MI')`
	defaultSuffix      = "_default"
	// partitionStorage are the storage parameters of every partition
	// (a partitioned table itself holds none): vacuum after 1% changed.
	partitionStorage = `WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.01)`
)

// partitionName returns the unquoted name of the partition starting at from.
func (d *sqlDialect) partitionName(from time.Time) string {
	return d.opts.OutboxTable + from.UTC().Format(partitionSuffix)
}

// pgTimestamp renders t as a timestamptz literal for partition bounds,
// which take no parameters.
func pgTimestamp(t time.Time) string {
	return `'` + t.UTC().Format("2006-01-02 15:04:05.999999") + `+00'`
}

// partitionedOutbox returns the statements creating the partitioned
// outbox: the table, its indexes, the default partition, and the current
// and Ahead following partitions by the database's clock.
func (d *sqlDialect) partitionedOutbox() []string {
	p, o, t := d.opts.Partitioned, d.outbox, d.opts.OutboxTable
	secs := strconv.FormatInt(int64(p.Interval/time.Second), 10)
	origin := strconv.FormatInt(partitionOrigin.Unix(), 10)
	schema := `''`
	if d.opts.Schema != "" {
		schema = `quote_ident('` + d.opts.Schema + `') || '.'`
	}
	return []string{
		// The columns are those of the plain layout; the primary key
		// holds the partition key, as Postgres requires.
		`CREATE TABLE IF NOT EXISTS ` + o + ` (
	id              bigint GENERATED ALWAYS AS IDENTITY,` + outboxColumns + `,
	PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at)`,
		`CREATE INDEX IF NOT EXISTS ` + quote(t+"_pending_idx") + ` ON ` + o +
			` (id) WHERE dead_at IS NULL AND published_at IS NULL`,
		`CREATE INDEX IF NOT EXISTS ` + quote(t+"_retry_idx") + ` ON ` + o +
			` (key_hash, id) WHERE attempts > 0 AND dead_at IS NULL AND published_at IS NULL`,
		`CREATE INDEX IF NOT EXISTS ` + quote(t+"_dead_idx") + ` ON ` + o +
			` (id) WHERE dead_at IS NOT NULL`,
		// Rows without a partition of their own land here rather than
		// fail the business transaction.
		`CREATE TABLE IF NOT EXISTS ` + d.qualify(t+defaultSuffix) + ` PARTITION OF ` + o + ` DEFAULT ` + partitionStorage,
		// The first partitions, so that rows written before the first
		// maintenance run do not land in the default partition.
		`DO $millbox$
DECLARE
	first timestamptz := to_timestamp(` + origin + ` + floor((extract(epoch FROM now()) - ` + origin + `) / ` + secs + `) * ` + secs + `);
	s timestamptz;
BEGIN
	FOR i IN 0..` + strconv.Itoa(p.Ahead) + ` LOOP
		s := first + i * interval '` + secs + ` seconds';
		EXECUTE format('CREATE TABLE IF NOT EXISTS %s PARTITION OF %s FOR VALUES FROM (%L) TO (%L) ` + partitionStorage + `',
			` + schema + ` || quote_ident('` + t + `' || ` + partitionSuffixSQL + `), '` + o + `', s, s + interval '` + secs + ` seconds');
	END LOOP;
END
$millbox$`,
	}
}

// partitionedKept returns the statements creating the kept rows' table of
// the partitioned layout: partitioned by created_at like the outbox, with
// a default partition and, for every partition of the outbox, one over
// the same range (<outbox>_k… next to <outbox>_p…), so that retention
// drops a range's kept rows with its outbox partition.
func (d *sqlDialect) partitionedKept() []string {
	t := d.opts.OutboxTable
	schema := `''`
	if d.opts.Schema != "" {
		schema = `quote_ident('` + d.opts.Schema + `') || '.'`
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + d.kept + ` (
	id           bigint      NOT NULL,` + keptColumnsDDL + `,
	PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE IF NOT EXISTS ` + d.qualify(t+keptSuffix+defaultSuffix) + ` PARTITION OF ` + d.kept + ` DEFAULT ` + partitionStorage,
		`DO $millbox$
DECLARE
	p record;
BEGIN
	FOR p IN SELECT c.relname::text AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = '` + d.outbox + `'::regclass AND c.relname::text LIKE '` + t + `\_p%'
	LOOP
		EXECUTE format('CREATE TABLE IF NOT EXISTS %s PARTITION OF %s %s ` + partitionStorage + `',
			` + schema + ` || quote_ident('` + t + keptPartitionInfix + `' || substr(p.name, ` + fmt.Sprint(len(t)+3) + `)), '` + d.kept + `', p.bound);
	END LOOP;
END
$millbox$`,
	}
}

// keptPartitionInfix starts the suffix of a kept partition's name where an
// outbox partition's has "_p": <outbox>_k20060102_1504 fits the same 63
// bytes as <outbox>_p20060102_1504.
const keptPartitionInfix = "_k"

// keptPartitionName returns the unquoted name of the kept rows' partition
// over the range of the outbox partition named name.
func (d *sqlDialect) keptPartitionName(name string) string {
	return d.opts.OutboxTable + keptPartitionInfix + strings.TrimPrefix(name, d.opts.OutboxTable+"_p")
}

// layout returns the migrations of the plain layout as they are, or with
// the outbox statements of version 1 replaced by those of the partitioned
// layout.
func (d *sqlDialect) layout(ms []sqladapters.Migration) []sqladapters.Migration {
	if d.opts.Partitioned == nil || len(ms) == 0 || ms[0].Version != 1 {
		return ms
	}
	out := slices.Clone(ms)
	stmts := d.partitionedOutbox()
	for _, s := range ms[0].Statements {
		// The outbox's own statements name it followed by a space; the
		// lease and member tables only start with its name.
		if !strings.Contains(s, d.outbox+" ") {
			stmts = append(stmts, s)
		}
	}
	out[0].Statements = stmts
	return out
}
