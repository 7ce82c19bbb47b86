package mysql

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

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
	// MaxTableNameLength leaves room for the longest derived table name,
	// OutboxTable + "_migrations", within MySQL's 64 bytes. Index names are
	// local to their table in MySQL, so they need no room.
	MaxTableNameLength = 64 - len("_migrations")
	// MaxDatabaseNameLength is the longest Options.Database. MySQL allows
	// 64 bytes; sqladapters.ValidateIdentifier allows 63 for every
	// database.
	MaxDatabaseNameLength = sqladapters.MaxIdentifierLength
	// DefaultMigrationLockTimeout is how long Migrate waits for another
	// migrator to finish when Options leaves MigrationLockTimeout zero.
	DefaultMigrationLockTimeout = time.Minute
	// DefaultMaxInsertBytes is the size budget of one outbox INSERT when
	// Options leaves MaxInsertBytes zero. Even if every byte needed
	// escaping, such a statement fits the smallest default
	// max_allowed_packet (4 MiB on MySQL 5.7; 16 MiB on MariaDB, 64 MiB on
	// MySQL 8), and it is large enough that round trips stop mattering.
	DefaultMaxInsertBytes = 2 << 20
	// DefaultMaxAllowedPacket is the server's max_allowed_packet the
	// dialect assumes when Options leaves MaxAllowedPacket zero: MariaDB's
	// default (MySQL 8.0 has 64 MiB, MySQL 5.7 4 MiB).
	DefaultMaxAllowedPacket = 16 << 20
	// MinMaxAllowedPacket is the smallest Options.MaxAllowedPacket, and
	// the smallest max_allowed_packet MySQL accepts.
	MinMaxAllowedPacket = 1 << 10

	// packetReserve is the room an INSERT of one message needs besides
	// its escaped arguments: the statement text, the qualified table name
	// and the packet's command byte.
	packetReserve = 512
	// savepoint names the savepoint a Publish call of several statements
	// writes under.
	savepoint = `millbox_publish`

	// rowsPerInsert keeps one INSERT (6 placeholders a row) under MySQL's
	// 65,535 placeholders per statement.
	rowsPerInsert = 10000
	// rowOverhead estimates the SQL text of one VALUES tuple besides its
	// arguments.
	rowOverhead = 64
	// now is the database clock in UTC. MySQL evaluates it once per
	// statement, so every use within one statement agrees.
	now = `UTC_TIMESTAMP(6)`
	// nowPlus is now shifted by a placeholder holding microseconds.
	nowPlus = `UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND`
	// timeLayout renders a time for comparison with a DATETIME(6) column.
	timeLayout = "2006-01-02 15:04:05.000000"
	// maxErrorBytes bounds last_error, a TEXT column of 65,535 bytes.
	maxErrorBytes = 16 << 10

	// Widths of the VARBINARY key columns. Longer values are stored as
	// their digest (see fitKey).
	maxOwnerBytes     = 255
	maxConsumerBytes  = 255
	maxMessageIDBytes = 512
)

// Options names the tables of one millbox installation and tunes the SQL.
type Options struct {
	// Database holding the tables. Defaults to "" (unqualified names, found
	// in the connection's default database, the one named in the DSN).
	// Migrate creates it if missing.
	Database string
	// OutboxTable defaults to DefaultOutboxTable. The tables of dead
	// letters, of forwarded rows kept for audit, of retry markers, of
	// leases, members and migrations are named after it with the suffixes
	// _dead, _kept, _retries, _scheduled, _leases, _members and
	// _migrations.
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
	// SkipLocked tells the dialect that the server supports FOR UPDATE
	// SKIP LOCKED (MySQL 8.0.1+, MariaDB 10.6+): partition claims then skip
	// lease rows another instance is claiming instead of waiting for it.
	// DetectSkipLocked finds the right value. Defaults to false, which
	// works on every server.
	SkipLocked bool
	// MigrationLockTimeout bounds how long Migrate waits for a concurrent
	// migrator; it is rounded up to whole seconds. Defaults to
	// DefaultMigrationLockTimeout.
	MigrationLockTimeout time.Duration
	// MaxInsertBytes is the size budget of one outbox INSERT, counting
	// every argument byte twice (escaping may double it). A Publish call
	// over the budget is split into several INSERTs; a single larger
	// message goes alone. Keep it below the server's max_allowed_packet.
	// Defaults to DefaultMaxInsertBytes, or less when MaxAllowedPacket
	// leaves less room; a larger value than MaxAllowedPacket allows is
	// refused.
	MaxInsertBytes int
	// MaxAllowedPacket is the server's max_allowed_packet, the largest
	// statement it accepts. The dialect derives MaxMessageBytes from it,
	// and the publisher refuses a larger message with
	// forwarder.ErrInvalidMessage instead of sending a statement the
	// server would refuse (closing the connection). DetectMaxAllowedPacket
	// reads the value from the server. Defaults to DefaultMaxAllowedPacket.
	MaxAllowedPacket int
}

// Dialect is the MySQL and MariaDB implementation of the store contract,
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

// sqlDialect builds the MySQL/MariaDB statements the Store runs.
type sqlDialect struct {
	opts                                    Options
	outbox, inbox, leases, members, migrate string
	dead, kept, retries, scheduled          string
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
	opts.MigrationLockTimeout = cmp.Or(opts.MigrationLockTimeout, DefaultMigrationLockTimeout)
	opts.MaxAllowedPacket = cmp.Or(opts.MaxAllowedPacket, DefaultMaxAllowedPacket)
	opts.MaxInsertBytes = cmp.Or(opts.MaxInsertBytes, max(1, min(DefaultMaxInsertBytes, opts.MaxAllowedPacket-packetReserve)))
	if err := opts.validate(); err != nil {
		return nil, err
	}
	d := &sqlDialect{opts: opts}
	d.outbox = d.qualify(opts.OutboxTable)
	d.inbox = d.qualify(opts.InboxTable)
	d.leases = d.qualify(opts.OutboxTable + "_leases")
	d.members = d.qualify(opts.OutboxTable + "_members")
	d.migrate = d.qualify(opts.OutboxTable + "_migrations")
	d.dead = d.qualify(opts.OutboxTable + "_dead")
	d.kept = d.qualify(opts.OutboxTable + "_kept")
	d.scheduled = d.qualify(opts.OutboxTable + "_scheduled")
	d.retries = d.qualify(opts.OutboxTable + "_retries")
	return d, nil
}

func (o Options) validate() error {
	if o.Database != "" {
		if err := sqladapters.ValidateIdentifier("mysql.Options.Database", o.Database); err != nil {
			return err
		}
	}
	for _, f := range []struct{ field, name string }{
		{"mysql.Options.OutboxTable", o.OutboxTable},
		{"mysql.Options.InboxTable", o.InboxTable},
	} {
		if err := sqladapters.ValidateTableName(f.field, f.name, MaxTableNameLength); err != nil {
			return err
		}
	}
	// Table names are case-insensitive where MySQL stores them
	// lower-cased (lower_case_table_names=1, the default on Windows and
	// macOS), so compare them that way everywhere.
	if err := sqlstore.CheckNames("mysql.Options", o.OutboxTable, o.InboxTable, objects(o), true); err != nil {
		return err
	}
	if o.MigrationLockTimeout < 0 {
		return fmt.Errorf("millbox: mysql.Options.MigrationLockTimeout %v is negative", o.MigrationLockTimeout)
	}
	if o.MaxInsertBytes < 0 {
		return fmt.Errorf("millbox: mysql.Options.MaxInsertBytes %d is negative", o.MaxInsertBytes)
	}
	if o.MaxAllowedPacket < MinMaxAllowedPacket {
		return fmt.Errorf("millbox: mysql.Options.MaxAllowedPacket %d is below MySQL's minimum of %d", o.MaxAllowedPacket, MinMaxAllowedPacket)
	}
	if o.MaxInsertBytes > o.MaxAllowedPacket-packetReserve {
		return fmt.Errorf("millbox: mysql.Options.MaxInsertBytes %d does not fit MaxAllowedPacket %d with %d bytes for the statement",
			o.MaxInsertBytes, o.MaxAllowedPacket, packetReserve)
	}
	return nil
}

// objects lists every table the migrations create, in the order of
// Tables. Indexes are named within their table on MySQL, so they cannot
// clash with a table.
func objects(o Options) []sqlstore.Object {
	t := o.OutboxTable
	var objs []sqlstore.Object
	for _, name := range []string{t, t + "_leases", t + "_members", o.InboxTable, t + "_migrations", t + "_dead", t + "_kept", t + "_retries", t + "_scheduled"} {
		objs = append(objs, sqlstore.Object{Name: name, Table: true})
	}
	return objs
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

// quote backtick-quotes a validated identifier, which never contains a
// backtick.
func quote(ident string) string { return "`" + ident + "`" }

func (d *sqlDialect) qualify(name string) string {
	if d.opts.Database == "" {
		return quote(name)
	}
	return quote(d.opts.Database) + "." + quote(name)
}

// Name returns "mysql"; the dialect serves MySQL and MariaDB alike.
func (d *sqlDialect) Name() string { return "mysql" }

// Features reports MySQL's capabilities: DDL commits implicitly, there are
// no notifications, and SKIP LOCKED is what Options.SkipLocked says.
func (d *sqlDialect) Features() sqladapters.Features {
	return sqladapters.Features{
		TransactionalDDL:  false,
		Notify:            false,
		SkipLocked:        d.opts.SkipLocked,
		ConcurrentWriters: true,
		ExcludeInSQL:      true,
	}
}

// OutboxTable returns the quoted outbox table name.
func (d *sqlDialect) OutboxTable() string { return d.outbox }

// InboxTable returns the quoted inbox table name.
func (d *sqlDialect) InboxTable() string { return d.inbox }

// Tables returns the quoted, qualified names of every table Migrate
// creates: outbox, leases, members, inbox, the version table, then the
// dead letters, the kept rows and the retry markers.
func (d *Dialect) Tables() []string { return d.sql.tables() }

func (d *sqlDialect) tables() []string {
	names := sqlstore.TableNames(d.Objects())
	for i, n := range names {
		names[i] = d.qualify(n)
	}
	return names
}

// Objects lists the tables the migrations create (see sqlstore.Object).
func (d *sqlDialect) Objects() []sqlstore.Object { return objects(d.opts) }

// Database returns Options.Database, "" when names are unqualified.
func (d *Dialect) Database() string { return d.sql.opts.Database }

// NotifyChannel returns "": MySQL has no notifications. Forwarders poll,
// and a publisher in the same process wakes them directly.
func (d *sqlDialect) NotifyChannel() string { return "" }

// MySQL error numbers ClassifyError maps.
const (
	erBadDB       = 1049 // ER_BAD_DB_ERROR: unknown database
	erNoSuchTable = 1146 // ER_NO_SUCH_TABLE
	erDupEntry    = 1062 // ER_DUP_ENTRY

	erLockWaitTimeout = 1205 // ER_LOCK_WAIT_TIMEOUT
	erDeadlock        = 1213 // ER_LOCK_DEADLOCK
)

// ClassifyError maps MySQL errors 1146 (table does not exist) and 1049
// (unknown database) to *sqladapters.MissingTableError and 1062 (duplicate
// entry) to sqladapters.ErrDuplicate. It recognizes the errors of
// github.com/go-sql-driver/mysql, the driver MySQL users of database/sql
// have.
func (d *sqlDialect) ClassifyError(err error) error {
	var me *mysqldrv.MySQLError
	if err == nil || !errors.As(err, &me) {
		return err
	}
	switch me.Number {
	case erNoSuchTable, erBadDB:
		return &sqladapters.MissingTableError{Dialect: d.Name(), Err: err}
	case erDupEntry:
		return fmt.Errorf("%w: %w", sqladapters.ErrDuplicate, err)
	}
	return err
}

// DetectSkipLocked reports whether the server behind e supports SELECT ...
// FOR UPDATE SKIP LOCKED (MySQL 8.0.1 and later, MariaDB 10.6 and later),
// from SELECT VERSION(). Pass the result as Options.SkipLocked.
func DetectSkipLocked(ctx context.Context, e sqladapters.Executor) (bool, error) {
	rows, err := e.Query(ctx, `SELECT VERSION()`)
	if err != nil {
		return false, fmt.Errorf("millbox: mysql: read server version: %w", err)
	}
	defer rows.Close()
	var version string
	if rows.Next() {
		err = rows.Scan(&version)
	} else if err = rows.Err(); err == nil {
		err = errors.New("no row")
	}
	if err != nil {
		return false, fmt.Errorf("millbox: mysql: read server version: %w", err)
	}
	return skipLockedIn(version)
}

// skipLockedIn tells from a VERSION() string, such as "8.0.36",
// "10.11.6-MariaDB-0+deb12u1" or "5.5.5-10.6.12-MariaDB", whether the
// server has SKIP LOCKED.
func skipLockedIn(version string) (bool, error) {
	lower := strings.ToLower(version)
	if strings.Contains(lower, "tidb") {
		// TiDB reports a MySQL version it does not match in locking.
		return false, nil
	}
	mariadb := strings.Contains(lower, "mariadb")
	v := version
	// MariaDB behind some proxies reports a 5.5.5- prefix for old clients.
	if mariadb {
		v = strings.TrimPrefix(v, "5.5.5-")
	}
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false, fmt.Errorf("millbox: mysql: cannot parse server version %q", version)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	patch := 0
	if len(parts) == 3 {
		digits := parts[2]
		if i := strings.IndexFunc(digits, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
			digits = digits[:i]
		}
		patch, _ = strconv.Atoi(digits)
	}
	if err1 != nil || err2 != nil {
		return false, fmt.Errorf("millbox: mysql: cannot parse server version %q", version)
	}
	if mariadb {
		return major > 10 || major == 10 && minor >= 6, nil
	}
	return major > 8 || major == 8 && (minor > 0 || patch >= 1), nil
}

// MaxMessageBytes is the largest message the dialect stores, counting its
// topic, UUID, payload, metadata and ordering key: half of
// Options.MaxAllowedPacket, less the room of the statement. Escaping, which
// the driver applies with interpolateParams=true, may double every byte,
// and a message larger than MaxAllowedPacket/2 would then not fit one
// statement. The publisher refuses larger messages before it writes
// anything.
func (d *sqlDialect) MaxMessageBytes() int { return (d.opts.MaxAllowedPacket - packetReserve) / 2 }

// Savepoint returns the statements the publisher writes a call of several
// INSERTs under: a failed INSERT undoes only itself in MySQL, so without
// the savepoint the earlier INSERTs of a failed call would stay in the
// transaction.
func (d *sqlDialect) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT ` + savepoint},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT ` + savepoint}, true
}

// DetectMaxAllowedPacket reads the server's max_allowed_packet through e.
// Pass the result as Options.MaxAllowedPacket.
func DetectMaxAllowedPacket(ctx context.Context, e sqladapters.Executor) (int, error) {
	rows, err := e.Query(ctx, `SELECT @@max_allowed_packet`)
	if err != nil {
		return 0, fmt.Errorf("millbox: mysql: read max_allowed_packet: %w", err)
	}
	defer rows.Close()
	var n int64
	if rows.Next() {
		err = rows.Scan(&n)
	} else if err = rows.Err(); err == nil {
		err = errors.New("no row")
	}
	if err != nil {
		return 0, fmt.Errorf("millbox: mysql: read max_allowed_packet: %w", err)
	}
	return int(n), nil
}

// fitKey returns s when it fits a VARBINARY(limit) key column and its
// SHA-256 otherwise, so an over-long value is never truncated into another
// value's key. The digest starts with a NUL byte, which the inbox refuses
// in real keys, so it cannot equal one.
func fitKey(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "\x00sha256:" + hex.EncodeToString(sum[:])
}

// micros renders a duration as the argument of "INTERVAL ? MICROSECOND".
func micros(t time.Duration) int64 { return t.Microseconds() }

// intList renders ids as a comma-separated list of integer literals. The
// values are formatted integers, never text from outside, so inlining them
// is safe; it keeps statements clear of the 65,535-placeholder limit.
func intList[T int | int64](ids []T) string {
	var b strings.Builder
	b.Grow(len(ids) * 8)
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(int64(id), 10))
	}
	return b.String()
}

// Options returns the options the dialect was built with, defaults applied.
func (d *Dialect) Options() Options { return d.sql.opts }
