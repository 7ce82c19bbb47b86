package postgres

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

const (
	// DefaultOutboxTable is the outbox table name used when Options leaves
	// it empty.
	DefaultOutboxTable = "millbox_outbox"
	// DefaultInboxTable is the inbox table name used when Options leaves it
	// empty.
	DefaultInboxTable = "millbox_inbox"
	// MaxTableNameLength leaves room for the suffixes of derived names
	// (indexes, lease and migration tables) within Postgres' 63 bytes.
	MaxTableNameLength = 48
	// rowsPerInsert keeps one INSERT under Postgres' 65,535 parameters.
	rowsPerInsert = 5000
)

// Options names the tables of one millbox installation.
type Options struct {
	// Schema holding the tables. Defaults to "" (unqualified names, found
	// through the connection's search_path). Migrate creates it if missing.
	Schema string
	// OutboxTable defaults to DefaultOutboxTable. The tables of dead
	// letters, of forwarded rows kept for audit, of scheduled messages, of
	// leases, members and migrations are named after it with the suffixes
	// _dead, _kept, _scheduled, _leases, _members and _migrations.
	OutboxTable string
	// InboxTable defaults to DefaultInboxTable. New refuses a name that
	// the migrations give a table or index of the outbox (such as
	// OutboxTable with _dead or _scheduled), and an OutboxTable whose
	// names take one of the inbox's.
	InboxTable string
	// WithoutInbox leaves the inbox table out of the migrations, for an
	// application that only publishes. The inbox then fails with a
	// *sqladapters.MissingTableError; migrating again without this option
	// creates it. Defaults to false.
	WithoutInbox bool
	// Notify makes the outbox insert call pg_notify, so that forwarders
	// connected through pgxv5.WrapPool wake up on the commit instead of
	// at their next look at the table (forwarder.Polling.WatchInterval, a few
	// milliseconds). Defaults to false: NOTIFY takes a database-wide lock
	// at commit that serializes every committing transaction that
	// notified, which costs far more under concurrent writers than the
	// milliseconds it saves.
	Notify bool
	// FlushStats makes every insert of a Publish call (into the outbox
	// and into the scheduled table) also call pg_stat_force_next_flush(),
	// so that the writing session reports its statistics as its
	// transaction ends. A fleet's stat doorbell watches the database's
	// insert counter in pg_stat_database, which a session otherwise
	// updates up to 10 s late (60 s under lock contention) when it
	// commits less than a second after its previous report and then
	// idles, as a request that reads, writes and returns does. Every
	// publishing transaction pays for the report; see "Statistics for a
	// fleet" in the package documentation. It needs PostgreSQL 15 or
	// later: on earlier servers the insert fails, the function does not
	// exist. Defaults to false.
	FlushStats bool
	// Partitioned, when set, makes the migrations create the outbox as a
	// table partitioned by creation time, whose retention drops whole
	// partitions; see PartitionOptions and MaintainPartitions. It applies
	// to new installations: an existing plain outbox is not converted.
	// Defaults to nil, a plain table.
	Partitioned *PartitionOptions
}

// Dialect is the PostgreSQL implementation of the store contract,
// sqladapters.Dialect, for one millbox installation (its outbox, lease and
// inbox tables). Build it with New; pass it to the publisher, the
// forwarder, the inbox and the operations tools.
type Dialect struct {
	*sqlStore
	sql *sqlDialect
}

// sqlStore runs the statements of sqlDialect: the contract's methods.
type sqlStore = sqlstore.Store

var (
	_ sqladapters.Dialect    = (*Dialect)(nil)
	_ sqladapters.Maintainer = (*Dialect)(nil)
)

// sqlDialect builds the PostgreSQL statements the Store runs.
type sqlDialect struct {
	opts                                    Options
	outbox, inbox, leases, members, migrate string
	dead, kept, scheduled                   string
	emits                                   string // the count of calls without a table
	channel                                 string
}

// New validates opts, applies defaults and returns the dialect.
func New(opts Options) (*Dialect, error) {
	b, err := newSQL(opts)
	if err != nil {
		return nil, err
	}
	return &Dialect{sqlStore: sqlstore.New(b), sql: b}, nil
}

func newSQL(opts Options) (*sqlDialect, error) {
	opts.OutboxTable = cmp.Or(opts.OutboxTable, DefaultOutboxTable)
	opts.InboxTable = cmp.Or(opts.InboxTable, DefaultInboxTable)
	if opts.Schema != "" {
		if err := sqladapters.ValidateIdentifier("postgres.Options.Schema", opts.Schema); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct{ field, name string }{
		{"postgres.Options.OutboxTable", opts.OutboxTable},
		{"postgres.Options.InboxTable", opts.InboxTable},
	} {
		if err := sqladapters.ValidateTableName(f.field, f.name, MaxTableNameLength); err != nil {
			return nil, err
		}
	}
	if opts.Partitioned != nil {
		p := opts.Partitioned.withDefaults()
		if err := p.Validate(); err != nil {
			return nil, err
		}
		opts.Partitioned = &p
	}
	if err := sqlstore.CheckNames("postgres.Options", opts.OutboxTable, opts.InboxTable, objects(opts), false); err != nil {
		return nil, err
	}
	d := &sqlDialect{opts: opts}
	d.outbox = d.qualify(opts.OutboxTable)
	d.inbox = d.qualify(opts.InboxTable)
	d.leases = d.qualify(opts.OutboxTable + "_leases")
	d.members = d.qualify(opts.OutboxTable + "_members")
	d.migrate = d.qualify(opts.OutboxTable + "_migrations")
	d.dead = d.qualify(opts.OutboxTable + deadSuffix)
	d.kept = d.qualify(opts.OutboxTable + keptSuffix)
	d.scheduled = d.qualify(opts.OutboxTable + scheduledSuffix)
	d.emits = d.qualify(opts.OutboxTable + emitsSuffix)
	if opts.Notify {
		d.channel = channelName(opts.Schema, opts.OutboxTable)
	}
	return d, nil
}

// MustNew is New that panics on invalid options, for package-level
// variables with constant names.
func MustNew(opts Options) *Dialect {
	d, err := New(opts)
	if err != nil {
		panic(err)
	}
	return d
}

func quote(ident string) string { return `"` + ident + `"` }

func (d *sqlDialect) qualify(name string) string {
	if d.opts.Schema == "" {
		return quote(name)
	}
	return quote(d.opts.Schema) + "." + quote(name)
}

func channelName(schema, table string) string {
	name := "millbox_" + table
	if schema != "" {
		name = "millbox_" + schema + "_" + table
	}
	if len(name) <= 63 {
		return name
	}
	h := fnv.New32a()
	h.Write([]byte(schema + "." + table))
	return fmt.Sprintf("millbox_%08x", h.Sum32())
}

// Name returns "postgres".
func (d *sqlDialect) Name() string { return "postgres" }

// Features reports PostgreSQL's capabilities.
func (d *sqlDialect) Features() sqladapters.Features {
	return sqladapters.Features{
		TransactionalDDL:  true,
		Notify:            d.opts.Notify,
		SkipLocked:        true,
		ConcurrentWriters: true,
		ExcludeInSQL:      true,
	}
}

// OutboxTable returns the quoted outbox table name.
func (d *sqlDialect) OutboxTable() string { return d.outbox }

// InboxTable returns the quoted inbox table name.
func (d *sqlDialect) InboxTable() string { return d.inbox }

// NotifyChannel returns the channel the outbox insert notifies, or "" when
// notifications are disabled.
func (d *sqlDialect) NotifyChannel() string { return d.channel }

type sqlStater interface{ SQLState() string }

// ClassifyError maps SQLSTATE 42P01 (undefined table) and 3F000 (undefined
// schema) to *sqladapters.MissingTableError and 23505 (unique violation) to
// sqladapters.ErrDuplicate. It recognizes pgx and lib/pq errors.
func (d *sqlDialect) ClassifyError(err error) error {
	var se sqlStater
	if err == nil || !errors.As(err, &se) {
		return err
	}
	switch se.SQLState() {
	case "42P01", "3F000":
		return &sqladapters.MissingTableError{Dialect: d.Name(), Err: err}
	case "23505":
		return fmt.Errorf("%w: %w", sqladapters.ErrDuplicate, err)
	}
	return err
}

// micros renders a duration as a parameter for "$n * interval '1 microsecond'".
func micros(t time.Duration) int64 { return t.Microseconds() }

// int64Array renders ids as a Postgres array literal. Passing it as text
// with a ::bigint[] cast works with every driver (lib/pq has no native
// slice parameters).
func int64Array(ids []int64) string {
	var b strings.Builder
	b.Grow(len(ids) * 8)
	b.WriteByte('{')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte('}')
	return b.String()
}

// textArray renders strings as a text[] literal, every element quoted.
func textArray(v []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, c := range []byte(s) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

func intArray(v []int) string {
	ids := make([]int64, len(v))
	for i, x := range v {
		ids[i] = int64(x)
	}
	return int64Array(ids)
}

// Schema returns the schema name, "" when names are unqualified.
func (d *Dialect) Schema() string { return d.sql.opts.Schema }

// Options returns the options the dialect was built with, defaults applied.
func (d *Dialect) Options() Options { return d.sql.opts }

// Tables returns the quoted names of every table the migrations create, for
// tools that clean up or inspect them: the outbox, leases, members, inbox
// and migrations, then the dead letters, the kept rows and the scheduled
// messages.
func (d *Dialect) Tables() []string {
	names := sqlstore.TableNames(d.sql.Objects())
	for i, n := range names {
		names[i] = d.sql.qualify(n)
	}
	return names
}

// Objects lists the names the migrations of opts create (see
// sqlstore.Object).
func (d *sqlDialect) Objects() []sqlstore.Object { return objects(d.opts) }

// objects lists every name the migrations create in the schema: the
// tables in the order of Tables, then the indexes (those of earlier
// versions that a later one drops too), the indexes and sequences Postgres
// names itself, and, on a partitioned outbox, the default partitions and
// the start of the names of the others.
func objects(opts Options) []sqlstore.Object {
	o, i := opts.OutboxTable, opts.InboxTable
	tables := []string{o, o + "_leases", o + "_members", i, o + "_migrations", o + deadSuffix, o + keptSuffix, o + scheduledSuffix}
	var objs []sqlstore.Object
	for _, t := range tables {
		objs = append(objs, sqlstore.Object{Name: t, Table: true})
	}
	names := []string{
		o + "_pending_idx", o + "_retry_idx", o + "_dead_idx", o + "_dead_fp_idx", o + deadFPSuffix, o + deadHoldSuffix,
		o + "_sched_idx", i + "_received_idx", implicitName(o, "id_seq"), implicitName(o+scheduledSuffix, "id_seq"), o + emitsSuffix,
	}
	for _, t := range tables {
		names = append(names, implicitName(t, "pkey"))
	}
	if opts.Partitioned != nil {
		for _, t := range []string{o + defaultSuffix, o + keptSuffix + defaultSuffix} {
			names = append(names, t, implicitName(t, "pkey"))
		}
		names = append(names, implicitName(o+defaultSuffix, "key_hash_id_idx"))
		objs = append(objs, sqlstore.Object{Name: o + "_p", Prefix: true}, sqlstore.Object{Name: o + keptPartitionInfix, Prefix: true})
	}
	for _, n := range names {
		objs = append(objs, sqlstore.Object{Name: n})
	}
	return objs
}

// implicitName is the name Postgres gives the index or sequence label of
// table (such as its primary key's, "pkey"): the table's name, cut so
// that the whole fits in 63 bytes, an underscore and label.
func implicitName(table, label string) string {
	const maxName = 63
	if n := maxName - len(label) - 1; len(table) > n {
		table = table[:n]
	}
	return table + "_" + label
}
