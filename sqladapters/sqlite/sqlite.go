package sqlite

import (
	"cmp"
	"errors"
	"fmt"
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
	// (indexes, lease, member and migration tables). SQLite has no length
	// limit of its own; this is the Postgres dialect's, so a configuration
	// moves between databases unchanged.
	MaxTableNameLength = 48
	// TimeLayout is the time.Layout of every time column: UTC with
	// milliseconds, exactly as strftime('%Y-%m-%dT%H:%M:%fZ') writes it.
	// The scheduled messages' due_at is the exception: an integer of
	// microseconds since the Unix epoch.
	TimeLayout = "2006-01-02T15:04:05.000Z"

	// rowsPerInsert keeps one INSERT (6 parameters a row) under SQLite's
	// default limit of 32,766 parameters.
	rowsPerInsert = 5000
	// now is SQLite's clock in TimeLayout. SQLite reads the clock once per
	// sqlite3_step, so all uses agree within an INSERT, UPDATE or DELETE
	// and within each row of a SELECT.
	now = `strftime('%Y-%m-%dT%H:%M:%fZ', 'now')`
	// nowPlus is now shifted by a modifier argument made by offset.
	nowPlus = `strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?)`
)

// Options names the tables of one millbox installation.
type Options struct {
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
}

// Dialect is the SQLite implementation of the store contract,
// sqladapters.Dialect, for one millbox installation (its outbox, lease and
// inbox tables). Build it with New; pass it to the publisher, the
// forwarder, the inbox and the operations tools.
type Dialect struct {
	*sqlStore
	sql *sqlDialect
}

// sqlStore runs the statements of sqlDialect: the contract's methods.
type sqlStore = sqlstore.Store

var _ sqladapters.Dialect = (*Dialect)(nil)

// sqlDialect builds the SQLite statements the Store runs.
type sqlDialect struct {
	opts                                    Options
	outbox, inbox, leases, members, migrate string
	dead, kept, scheduled                   string
	migrateLock                             string
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
	for _, f := range []struct{ field, name string }{
		{"sqlite.Options.OutboxTable", opts.OutboxTable},
		{"sqlite.Options.InboxTable", opts.InboxTable},
	} {
		if err := sqladapters.ValidateTableName(f.field, f.name, MaxTableNameLength); err != nil {
			return nil, err
		}
		// SQLite reserves names starting with sqlite_ for itself and
		// refuses to create such tables.
		if strings.HasPrefix(strings.ToLower(f.name), "sqlite_") {
			return nil, fmt.Errorf("%w: %s %q starts with sqlite_, which SQLite reserves", sqladapters.ErrInvalidName, f.field, f.name)
		}
	}
	// Tables and indexes share one namespace, in which SQLite compares
	// names case-insensitively.
	if err := sqlstore.CheckNames("sqlite.Options", opts.OutboxTable, opts.InboxTable, objects(opts), true); err != nil {
		return nil, err
	}
	return &sqlDialect{
		opts:        opts,
		outbox:      quote(opts.OutboxTable),
		inbox:       quote(opts.InboxTable),
		leases:      quote(opts.OutboxTable + "_leases"),
		members:     quote(opts.OutboxTable + "_members"),
		migrate:     quote(opts.OutboxTable + "_migrations"),
		dead:        quote(opts.OutboxTable + "_dead"),
		kept:        quote(opts.OutboxTable + "_kept"),
		scheduled:   quote(opts.OutboxTable + "_scheduled"),
		migrateLock: quote(opts.OutboxTable + "_migration_lock"),
	}, nil
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

// objects lists every table and index the migrations create, the tables
// in the order of Tables, then the indexes (those of earlier versions that
// a later one drops too) and the table that serializes migrators.
func objects(opts Options) []sqlstore.Object {
	o, i := opts.OutboxTable, opts.InboxTable
	var objs []sqlstore.Object
	for _, t := range []string{o, o + "_leases", o + "_members", i, o + "_migrations", o + "_dead", o + "_kept", o + "_scheduled"} {
		objs = append(objs, sqlstore.Object{Name: t, Table: true})
	}
	for _, n := range []string{
		o + "_pending_idx", o + "_retry_idx", o + "_dead_idx", o + "_dead_fp_idx", o + "_deadfp_idx", o + "_deadhold_idx",
		o + "_sched_idx", i + "_received_idx", o + "_migration_lock",
	} {
		objs = append(objs, sqlstore.Object{Name: n})
	}
	return objs
}

// quote double-quotes a validated identifier, which never contains a quote.
func quote(ident string) string { return `"` + ident + `"` }

// Name returns "sqlite".
func (d *sqlDialect) Name() string { return "sqlite" }

// Features reports SQLite's capabilities: transactional DDL, and nothing
// else a server database offers.
func (d *sqlDialect) Features() sqladapters.Features {
	return sqladapters.Features{
		TransactionalDDL:  true,
		Notify:            false,
		SkipLocked:        false,
		ConcurrentWriters: false,
		ExcludeInSQL:      true,
	}
}

// OutboxTable returns the quoted outbox table name.
func (d *sqlDialect) OutboxTable() string { return d.outbox }

// InboxTable returns the quoted inbox table name.
func (d *sqlDialect) InboxTable() string { return d.inbox }

// NotifyChannel returns "": SQLite has no notifications. Forwarders poll,
// and are woken in-process by publishers in the same process.
func (d *sqlDialect) NotifyChannel() string { return "" }

// SQLite result codes ClassifyError recognizes.
const (
	codeError                = 1    // SQLITE_ERROR, which "no such table" is
	codeConstraint           = 19   // SQLITE_CONSTRAINT, without extended codes
	codeConstraintPrimaryKey = 1555 // SQLITE_CONSTRAINT_PRIMARYKEY
	codeConstraintUnique     = 2067 // SQLITE_CONSTRAINT_UNIQUE
)

// coder is implemented by modernc.org/sqlite's *Error.
type coder interface{ Code() int }

// ClassifyError maps "no such table" to *sqladapters.MissingTableError and
// a violated UNIQUE or PRIMARY KEY constraint to sqladapters.ErrDuplicate.
// It reads the SQLite result code from errors with a Code() int method
// (modernc.org/sqlite) and otherwise matches SQLite's error text, which
// every driver passes on (mattn/go-sqlite3, ncruces/go-sqlite3).
func (d *sqlDialect) ClassifyError(err error) error {
	if err == nil || errors.Is(err, sqladapters.ErrMissingTable) || errors.Is(err, sqladapters.ErrDuplicate) {
		return err
	}
	code, hasCode := 0, false
	var c coder
	if errors.As(err, &c) {
		code, hasCode = c.Code(), true
	}
	msg := err.Error()
	switch {
	case code == codeConstraintUnique || code == codeConstraintPrimaryKey,
		(!hasCode || code == codeConstraint) && strings.Contains(msg, "UNIQUE constraint failed"):
		return fmt.Errorf("%w: %w", sqladapters.ErrDuplicate, err)
	case (!hasCode || code == codeError) && strings.Contains(msg, "no such table"):
		return &sqladapters.MissingTableError{Dialect: d.Name(), Err: err}
	}
	return err
}

// offset renders d as a strftime modifier such as "+1.500000 seconds".
// SQLite keeps milliseconds.
func offset(d time.Duration) string {
	us := d.Microseconds()
	sign := "+"
	if us < 0 {
		sign, us = "-", -us
	}
	return fmt.Sprintf("%s%d.%06d seconds", sign, us/1e6, us%1e6)
}

// formatTime renders t in TimeLayout, comparable with the time columns.
func formatTime(t time.Time) string { return t.UTC().Format(TimeLayout) }

// idList renders ids as a JSON array for json_each. One text parameter
// keeps the SQL text the same for any number of ids, so the statement is
// prepared once, and stays clear of the parameter limit.
func idList[T int | int64](ids []T) string {
	var b strings.Builder
	b.Grow(len(ids)*8 + 2)
	b.WriteByte('[')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(int64(id), 10))
	}
	b.WriteByte(']')
	return b.String()
}

// Options returns the options the dialect was built with, defaults applied.
func (d *Dialect) Options() Options { return d.sql.opts }

// Tables returns the quoted names of every table the migrations create, for
// tools that clean up or inspect them: the outbox, leases, members, inbox
// and migrations, then the dead letters, the kept rows and the scheduled
// messages.
func (d *Dialect) Tables() []string { return d.sql.tables() }

func (d *sqlDialect) tables() []string {
	names := sqlstore.TableNames(d.Objects())
	for i, n := range names {
		names[i] = quote(n)
	}
	return names
}

// Objects lists the tables and indexes the migrations create (see
// sqlstore.Object).
func (d *sqlDialect) Objects() []sqlstore.Object { return objects(d.opts) }
