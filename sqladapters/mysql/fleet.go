package mysql

import (
	"cmp"
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
	// DefaultFleetPrefix starts the names of a fleet's control tables when
	// FleetOptions leaves Prefix empty.
	DefaultFleetPrefix = "millbox_fleet"
	// MaxFleetPrefixLength is the longest FleetOptions.Prefix: the same in
	// every database package.
	MaxFleetPrefixLength = 40

	// fleetIDsPerStatement bounds the placeholders of a list of tenant
	// IDs.
	fleetIDsPerStatement = 1000
	// fleetInsertBytes bounds the argument bytes of one tenant INSERT,
	// counted twice for escaping (see Options.MaxInsertBytes), so that it
	// fits the smallest max_allowed_packet.
	fleetInsertBytes = 1 << 20
)

// FleetOptions names the control tables of a forwarder fleet (see
// sqladapters.FleetStore) and tunes their SQL.
type FleetOptions struct {
	// Database holding the tables. Defaults to "" (the connection's
	// default database). MigrateFleet creates it if missing.
	Database string
	// Prefix starts the names of the tables: <Prefix>_members,
	// <Prefix>_tenants, <Prefix>_version and <Prefix>_migrations. It must
	// not be the name of an outbox table in the same database, whose
	// tables take such names. Defaults to DefaultFleetPrefix.
	Prefix string
	// SkipLocked tells that the server supports FOR UPDATE SKIP LOCKED
	// (MySQL 8.0.1+, MariaDB 10.6+; DetectSkipLocked finds out): claimers
	// then skip the tenants another is claiming instead of waiting for
	// it. Defaults to false, which works on every server.
	SkipLocked bool
	// MigrationLockTimeout bounds how long MigrateFleet waits for a
	// concurrent migrator; it is rounded up to whole seconds. Defaults to
	// DefaultMigrationLockTimeout.
	MigrationLockTimeout time.Duration
}

// Fleet is the MySQL and MariaDB implementation of
// sqladapters.FleetStore: the control tables of a forwarder fleet. Build
// it with NewFleet.
type Fleet struct {
	*fleetStore
	sql *fleetSQL
}

// fleetStore runs the statements of fleetSQL: the contract's methods.
type fleetStore = sqlstore.FleetStore

var _ sqladapters.FleetStore = (*Fleet)(nil)

// fleetSQL builds the MySQL statements of the fleet's store.
type fleetSQL struct {
	opts                                 FleetOptions
	members, tenants, version, migration string
}

// NewFleet validates opts, applies defaults and returns the store.
func NewFleet(opts FleetOptions) (*Fleet, error) {
	opts.Prefix = cmp.Or(opts.Prefix, DefaultFleetPrefix)
	opts.MigrationLockTimeout = cmp.Or(opts.MigrationLockTimeout, DefaultMigrationLockTimeout)
	if opts.Database != "" {
		if err := sqladapters.ValidateIdentifier("mysql.FleetOptions.Database", opts.Database); err != nil {
			return nil, err
		}
	}
	if err := sqladapters.ValidateTableName("mysql.FleetOptions.Prefix", opts.Prefix, MaxFleetPrefixLength); err != nil {
		return nil, err
	}
	if opts.MigrationLockTimeout < 0 {
		return nil, fmt.Errorf("%w: mysql.FleetOptions.MigrationLockTimeout %v is negative", sqladapters.ErrInvalidConfig, opts.MigrationLockTimeout)
	}
	b := &fleetSQL{opts: opts}
	b.members = b.qualify(opts.Prefix + "_members")
	b.tenants = b.qualify(opts.Prefix + "_tenants")
	b.version = b.qualify(opts.Prefix + "_version")
	b.migration = b.qualify(opts.Prefix + "_migrations")
	return &Fleet{fleetStore: sqlstore.NewFleet(b), sql: b}, nil
}

// MustNewFleet is NewFleet that panics on invalid options, for
// package-level variables with constant names.
func MustNewFleet(opts FleetOptions) *Fleet {
	f, err := NewFleet(opts)
	if err != nil {
		panic(err)
	}
	return f
}

// Options returns the options the store was built with, defaults applied.
func (f *Fleet) Options() FleetOptions { return f.sql.opts }

func (b *fleetSQL) qualify(name string) string {
	if b.opts.Database == "" {
		return quote(name)
	}
	return quote(b.opts.Database) + "." + quote(name)
}

// Name returns "mysql".
func (b *fleetSQL) Name() string { return "mysql" }

// ClassifyError classifies as the outbox's dialect does.
func (b *fleetSQL) ClassifyError(err error) error { return (&sqlDialect{}).ClassifyError(err) }

// RetryConflict tells a deadlock (1213): InnoDB rolled the transaction
// back for a concurrent one, as its gap locks make concurrent inserts of
// new tenants do.
func (b *fleetSQL) RetryConflict(err error) bool {
	var me *mysqldrv.MySQLError
	return errors.As(err, &me) && me.Number == erDeadlock
}

// Tables returns the members, tenants, version and migrations tables.
func (b *fleetSQL) Tables() []string {
	return []string{b.members, b.tenants, b.version, b.migration}
}

// Savepoint returns the statements of a savepoint: a failed statement
// undoes only itself in MySQL.
func (b *fleetSQL) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT millbox_fleet`}, true
}

// IDsPerStatement bounds a list of IDs, one placeholder each.
func (b *fleetSQL) IDsPerStatement() int { return fleetIDsPerStatement }

// BeginWrite returns false: row locks let a transaction read, then wait
// to write.
func (b *fleetSQL) BeginWrite() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// Migrations lists the control tables' versions. Names are VARBINARY, so
// that they compare byte for byte: utf8mb4_bin still pads trailing spaces
// on MariaDB and MySQL 5.7. Every statement is idempotent, as DDL commits
// on its own.
//
// The members table has no index but its primary key: it holds a row per
// instance, and every statement then locks member rows in one order (a
// renewal its one row, a claim's delete of expired rows every row), where
// an index on expires_at made renewals and claims deadlock on its gaps.
//
// renewals changes with every renewal, so that the renewal's UPDATE
// always changes its row: MySQL reports changed rows, not matched ones
// (unless the client asks), and a renewal that left the row as it was
// would read as a lapse. The version starts from the clock in
// microseconds, so that tables created again never repeat a version.
func (b *fleetSQL) Migrations() []sqladapters.Migration {
	name := strconv.Itoa(sqladapters.MaxFleetNameBytes)
	path := strconv.Itoa(sqladapters.MaxFleetPathBytes)
	return []sqladapters.Migration{{
		Version: 1,
		Name:    "fleet members, tenants and catalog version",
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + b.members + ` (
	instance   VARBINARY(` + name + `) NOT NULL,
	expires_at DATETIME(6)    NOT NULL,
	renewals   BIGINT         NOT NULL DEFAULT 0,
	PRIMARY KEY (instance)
)` + tableOptions,
			`CREATE TABLE IF NOT EXISTS ` + b.tenants + ` (
	tenant        VARBINARY(` + name + `)  NOT NULL,
	server_name   VARBINARY(` + name + `)  NOT NULL,
	database_name VARBINARY(` + path + `) NOT NULL,
	schema_name   VARBINARY(` + path + `) NOT NULL,
	owner         VARBINARY(` + name + `)  NULL,
	removed_at    DATETIME(6)     NULL,
	PRIMARY KEY (tenant),
	KEY owner_idx (owner),
	KEY removed_idx (removed_at)
)` + tableOptions,
			`CREATE TABLE IF NOT EXISTS ` + b.version + ` (
	id      INT    NOT NULL,
	version BIGINT NOT NULL,
	PRIMARY KEY (id)
)` + tableOptions,
			`INSERT INTO ` + b.version + ` (id, version) VALUES (1, CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED))
ON DUPLICATE KEY UPDATE id = id`,
		},
	}}
}

// LockMigrations takes a named lock for the database and prefix (see
// sqlDialect.LockMigrations). The name holds a colon, which no table name
// has, so that it is never an outbox's lock.
func (b *fleetSQL) LockMigrations() (lock, unlock sqladapters.Query) {
	var db any
	if b.opts.Database != "" {
		db = b.opts.Database
	}
	return migrationLock(db, "fleet:"+b.opts.Prefix, b.opts.MigrationLockTimeout)
}

// CreateSchema creates FleetOptions.Database, when set.
func (b *fleetSQL) CreateSchema() []sqladapters.Query {
	if b.opts.Database == "" {
		return nil
	}
	return []sqladapters.Query{{SQL: `CREATE DATABASE IF NOT EXISTS ` + quote(b.opts.Database) + ` CHARACTER SET utf8mb4`}}
}

// ScriptNote says that the statements may run again.
func (b *fleetSQL) ScriptNote() string { return "Statements are idempotent." }

// CreateMigrationsTable creates the database (when set) and the version
// table.
func (b *fleetSQL) CreateMigrationsTable() []sqladapters.Query {
	return append(b.CreateSchema(), sqladapters.Query{SQL: `CREATE TABLE IF NOT EXISTS ` + b.migration + ` (
	version    INT          NOT NULL,
	name       VARCHAR(255) NOT NULL,
	applied_at DATETIME(6)  NOT NULL,
	PRIMARY KEY (version)
)` + tableOptions})
}

// AppliedMigrations selects the applied versions.
func (b *fleetSQL) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + b.migration + ` ORDER BY version`}
}

// RecordMigration records an applied version.
func (b *fleetSQL) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + b.migration + ` (version, name, applied_at) VALUES (?, ?, ` + now + `) ON DUPLICATE KEY UPDATE version = version`,
		Args: []any{version, name},
	}
}

// fleetTenantColumns are the columns every read of tenants selects
// first.
const fleetTenantColumns = `tenant, server_name, database_name, schema_name, removed_at IS NOT NULL`

// noLiveOwner is the predicate "the tenant has no live owner". NOT IN is
// exact here: instance is never NULL. An UPDATE or DELETE reads the
// members with shared locks, so it sees their latest rows.
func (b *fleetSQL) noLiveOwner() string {
	return `(owner IS NULL OR owner NOT IN (SELECT instance FROM ` + b.members + ` WHERE expires_at > ` + now + `))`
}

// idsIn renders "tenant IN (?, ...)" with ids as its arguments.
func idsIn(ids []string) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return `tenant IN (` + strings.Repeat(`?, `, len(ids)-1) + `?)`, args
}

// RenewMember extends a live member row.
func (b *fleetSQL) RenewMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.members + ` SET expires_at = ` + nowPlus + `, renewals = renewals + 1 WHERE instance = ? AND expires_at > ` + now,
		Args: []any{micros(ttl), instance},
	}
}

// JoinMember upserts a member row, spelling the expiry out twice (see
// sqlDialect.Heartbeat).
func (b *fleetSQL) JoinMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + b.members + ` (instance, expires_at) VALUES (?, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE expires_at = ` + nowPlus + `, renewals = renewals + 1`,
		Args: []any{instance, micros(ttl), micros(ttl)},
	}
}

// LiveMembers selects the live members.
func (b *fleetSQL) LiveMembers() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT instance FROM ` + b.members + ` WHERE expires_at > ` + now}
}

// RemoveMember deletes a member row.
func (b *fleetSQL) RemoveMember(instance string) sqladapters.Query {
	return sqladapters.Query{SQL: `DELETE FROM ` + b.members + ` WHERE instance = ?`, Args: []any{instance}}
}

// ReleaseAll clears the owner of an instance's tenants.
func (b *fleetSQL) ReleaseAll(instance string) sqladapters.Query {
	return sqladapters.Query{SQL: `UPDATE ` + b.tenants + ` SET owner = NULL WHERE owner = ?`, Args: []any{instance}}
}

// DeleteOwnedRemoved deletes an instance's removed tenants.
func (b *fleetSQL) DeleteOwnedRemoved(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE owner = ? AND removed_at IS NOT NULL`,
		Args: []any{instance},
	}
}

// CatalogVersion selects the catalog version.
func (b *fleetSQL) CatalogVersion() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + b.version + ` WHERE id = 1`}
}

// BumpVersion moves the catalog version.
func (b *fleetSQL) BumpVersion() sqladapters.Query {
	return sqladapters.Query{SQL: `UPDATE ` + b.version + ` SET version = version + 1 WHERE id = 1`}
}

// SelectTenants selects the catalog with the live owners.
func (b *fleetSQL) SelectTenants() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT t.tenant, t.server_name, t.database_name, t.schema_name, t.removed_at IS NOT NULL, m.instance
FROM ` + b.tenants + ` t LEFT JOIN ` + b.members + ` m ON m.instance = t.owner AND m.expires_at > ` + now}
}

// OwnedTenants selects the tenants of a live instance.
func (b *fleetSQL) OwnedTenants(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT ` + fleetTenantColumns + ` FROM ` + b.tenants + `
WHERE owner = ? AND EXISTS (SELECT 1 FROM ` + b.members + ` WHERE instance = ? AND expires_at > ` + now + `)`,
		Args: []any{instance, instance},
	}
}

// LockTenants selects and locks tenants in ID order.
func (b *fleetSQL) LockTenants(ids []string) sqladapters.Query {
	in, args := idsIn(ids)
	return sqladapters.Query{
		SQL:  `SELECT ` + fleetTenantColumns + ` FROM ` + b.tenants + ` WHERE ` + in + ` ORDER BY tenant FOR UPDATE`,
		Args: args,
	}
}

// InsertTenants inserts tenants, as many per statement as the
// placeholders and fleetInsertBytes allow. It is a plain INSERT: an
// upsert of several rows needs VALUES(), which MySQL 8 deprecates, or a
// row alias, which MariaDB lacks; a concurrent put of the same new
// tenant fails with a duplicate key (or a deadlock) and the store runs
// its transaction again.
func (b *fleetSQL) InsertTenants(ts []sqladapters.FleetTenant) []sqladapters.Query {
	var (
		qs    []sqladapters.Query
		sb    strings.Builder
		args  []any
		bytes int
	)
	flush := func() {
		if len(args) > 0 {
			qs = append(qs, sqladapters.Query{SQL: sb.String(), Args: args})
		}
		sb.Reset()
		args, bytes = nil, 0
	}
	for _, t := range ts {
		size := 2 * (len(t.ID) + len(t.Server) + len(t.Database) + len(t.Schema))
		if len(args) > 0 && (len(args)/4 >= fleetIDsPerStatement || bytes+size > fleetInsertBytes) {
			flush()
		}
		if len(args) == 0 {
			sb.WriteString(`INSERT INTO ` + b.tenants + ` (tenant, server_name, database_name, schema_name) VALUES (?, ?, ?, ?)`)
		} else {
			sb.WriteString(`, (?, ?, ?, ?)`)
		}
		args = append(args, t.ID, t.Server, t.Database, t.Schema)
		bytes += size
	}
	flush()
	return qs
}

// UpdateTenant changes a tenant and brings it back.
func (b *fleetSQL) UpdateTenant(t sqladapters.FleetTenant) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET server_name = ?, database_name = ?, schema_name = ?, removed_at = NULL WHERE tenant = ?`,
		Args: []any{t.Server, t.Database, t.Schema, t.ID},
	}
}

// MarkRemoved marks tenants removed.
func (b *fleetSQL) MarkRemoved(ids []string) sqladapters.Query {
	in, args := idsIn(ids)
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET removed_at = ` + now + ` WHERE ` + in + ` AND removed_at IS NULL`,
		Args: args,
	}
}

// DeleteUnowned deletes removed tenants without a live owner.
func (b *fleetSQL) DeleteUnowned(ids []string) sqladapters.Query {
	in, args := idsIn(ids)
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE ` + in + ` AND removed_at IS NOT NULL AND ` + b.noLiveOwner(),
		Args: args,
	}
}

// DeleteRemoved deletes an instance's removed tenants among ids.
func (b *fleetSQL) DeleteRemoved(instance string, ids []string) sqladapters.Query {
	in, args := idsIn(ids)
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE ` + in + ` AND owner = ? AND removed_at IS NOT NULL`,
		Args: append(args, instance),
	}
}

// ReleaseTenants clears the owner of an instance's tenants among ids.
func (b *fleetSQL) ReleaseTenants(instance string, ids []string) sqladapters.Query {
	in, args := idsIn(ids)
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET owner = NULL WHERE ` + in + ` AND owner = ?`,
		Args: append(args, instance),
	}
}

// Claim picks tenants with SELECT ... FOR UPDATE (SKIP LOCKED with
// FleetOptions.SkipLocked), walking the primary key in order, takes them
// with an UPDATE that checks them again, and reads back what it took:
// MySQL has no UPDATE ... RETURNING. A locking SELECT does not lock the
// rows its subquery reads, so the pick never skips, nor waits for, a
// member row.
func (b *fleetSQL) Claim(instance string, max int) sqlstore.FleetClaim {
	skip := ""
	if b.opts.SkipLocked {
		skip = ` SKIP LOCKED`
	}
	free := `removed_at IS NULL AND ` + b.noLiveOwner()
	return sqlstore.FleetClaim{
		DeleteDead: sqladapters.Query{SQL: `DELETE FROM ` + b.members + ` WHERE expires_at <= ` + now},
		Member: sqladapters.Query{
			SQL:  `SELECT 1 FROM ` + b.members + ` WHERE instance = ? AND expires_at > ` + now + ` LOCK IN SHARE MODE`,
			Args: []any{instance},
		},
		DeleteOrphans: sqladapters.Query{SQL: `DELETE FROM ` + b.tenants + ` WHERE removed_at IS NOT NULL AND ` + b.noLiveOwner()},
		Pick: sqladapters.Query{
			SQL:  `SELECT tenant FROM ` + b.tenants + ` WHERE ` + free + ` ORDER BY tenant LIMIT ? FOR UPDATE` + skip,
			Args: []any{max},
		},
		Take: func(ids []string) sqladapters.Query {
			in, args := idsIn(ids)
			return sqladapters.Query{
				SQL:  `UPDATE ` + b.tenants + ` SET owner = ? WHERE ` + in + ` AND ` + free,
				Args: append([]any{instance}, args...),
			}
		},
		Read: func(ids []string) sqladapters.Query {
			in, args := idsIn(ids)
			return sqladapters.Query{
				SQL:  `SELECT tenant, server_name, database_name, schema_name FROM ` + b.tenants + ` WHERE ` + in + ` AND owner = ?`,
				Args: append(args, instance),
			}
		},
	}
}
