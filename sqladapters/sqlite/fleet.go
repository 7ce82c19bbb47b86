package sqlite

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strings"
	"time"

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
)

// FleetOptions names the control tables of a forwarder fleet (see
// sqladapters.FleetStore), for tests and fleets of one process.
type FleetOptions struct {
	// Prefix starts the names of the tables: <Prefix>_members,
	// <Prefix>_tenants, <Prefix>_version and <Prefix>_migrations. It must
	// not be the name of an outbox table in the same file, whose tables
	// take such names. Defaults to DefaultFleetPrefix.
	Prefix string
}

// Fleet is the SQLite implementation of sqladapters.FleetStore: the
// control tables of a forwarder fleet. Build it with NewFleet. SQLite
// serializes writers, so claims take turns rather than skip each other.
type Fleet struct {
	*fleetStore
	sql *fleetSQL
}

// fleetStore runs the statements of fleetSQL: the contract's methods.
type fleetStore = sqlstore.FleetStore

var _ sqladapters.FleetStore = (*Fleet)(nil)

// fleetSQL builds the SQLite statements of the fleet's store.
type fleetSQL struct {
	opts                                       FleetOptions
	members, tenants, version, migration, lock string
}

// NewFleet validates opts, applies defaults and returns the store.
func NewFleet(opts FleetOptions) (*Fleet, error) {
	opts.Prefix = cmp.Or(opts.Prefix, DefaultFleetPrefix)
	if err := sqladapters.ValidateTableName("sqlite.FleetOptions.Prefix", opts.Prefix, MaxFleetPrefixLength); err != nil {
		return nil, err
	}
	if strings.HasPrefix(strings.ToLower(opts.Prefix), "sqlite_") {
		return nil, fmt.Errorf("%w: sqlite.FleetOptions.Prefix %q starts with sqlite_, which SQLite reserves", sqladapters.ErrInvalidName, opts.Prefix)
	}
	b := &fleetSQL{
		opts:      opts,
		members:   quote(opts.Prefix + "_members"),
		tenants:   quote(opts.Prefix + "_tenants"),
		version:   quote(opts.Prefix + "_version"),
		migration: quote(opts.Prefix + "_migrations"),
		lock:      quote(opts.Prefix + "_migration_lock"),
	}
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

// Name returns "sqlite".
func (b *fleetSQL) Name() string { return "sqlite" }

// ClassifyError classifies as the outbox's dialect does.
func (b *fleetSQL) ClassifyError(err error) error { return (&sqlDialect{}).ClassifyError(err) }

// RetryConflict returns false: SQLite's one writer never deadlocks.
func (b *fleetSQL) RetryConflict(error) bool { return false }

// Tables returns the members, tenants, version and migrations tables.
func (b *fleetSQL) Tables() []string {
	return []string{b.members, b.tenants, b.version, b.migration}
}

// Savepoint returns the statements of a savepoint.
func (b *fleetSQL) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT millbox_fleet`}, true
}

// IDsPerStatement returns 0: one JSON array parameter carries any number.
func (b *fleetSQL) IDsPerStatement() int { return 0 }

// BeginWrite rewrites the catalog version as it is: an UPDATE that
// matches a row always writes, so the transaction waits for the write
// lock under the busy timeout before it reads (see LockMigrations of the
// outbox's dialect).
func (b *fleetSQL) BeginWrite() (sqladapters.Query, bool) {
	return sqladapters.Query{SQL: `UPDATE ` + b.version + ` SET version = version WHERE id = 1`}, true
}

// Migrations lists the control tables' versions. TEXT compares byte for
// byte (the BINARY collation). The version starts from the clock in
// microseconds, so that tables created again never repeat a version an
// instance saw.
func (b *fleetSQL) Migrations() []sqladapters.Migration {
	p := b.opts.Prefix
	return []sqladapters.Migration{{
		Version: 1,
		Name:    "fleet members, tenants and catalog version",
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + b.members + ` (
	instance   TEXT NOT NULL PRIMARY KEY,
	expires_at TEXT NOT NULL
)`,
			`CREATE TABLE IF NOT EXISTS ` + b.tenants + ` (
	tenant        TEXT NOT NULL PRIMARY KEY,
	server_name   TEXT NOT NULL,
	database_name TEXT NOT NULL,
	schema_name   TEXT NOT NULL,
	owner         TEXT,
	removed_at    TEXT
)`,
			`CREATE INDEX IF NOT EXISTS ` + quote(p+"_tenants_owner_idx") + ` ON ` + b.tenants + ` (owner)`,
			`CREATE INDEX IF NOT EXISTS ` + quote(p+"_tenants_removed_idx") + ` ON ` + b.tenants + ` (tenant) WHERE removed_at IS NOT NULL`,
			`CREATE TABLE IF NOT EXISTS ` + b.version + ` (
	id      INTEGER PRIMARY KEY CHECK (id = 1),
	version INTEGER NOT NULL
)`,
			`INSERT INTO ` + b.version + ` (id, version) VALUES (1, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER))
ON CONFLICT (id) DO NOTHING`,
		},
	}}
}

// LockMigrations serializes migrators as the outbox's dialect does: a
// scratch table created first and dropped last.
func (b *fleetSQL) LockMigrations() (lock, unlock sqladapters.Query) {
	return sqladapters.Query{SQL: `CREATE TABLE ` + b.lock + ` (held INTEGER)`},
		sqladapters.Query{SQL: `DROP TABLE ` + b.lock}
}

// CreateSchema returns none: an SQLite database is its file.
func (b *fleetSQL) CreateSchema() []sqladapters.Query { return nil }

// ScriptNote says that the statements may run again.
func (b *fleetSQL) ScriptNote() string { return "Statements are idempotent." }

// CreateMigrationsTable creates the version table.
func (b *fleetSQL) CreateMigrationsTable() []sqladapters.Query {
	return []sqladapters.Query{{SQL: `CREATE TABLE IF NOT EXISTS ` + b.migration + ` (
	version    INTEGER PRIMARY KEY,
	name       TEXT      NOT NULL,
	applied_at TIMESTAMP NOT NULL DEFAULT (` + now + `)
)`}}
}

// AppliedMigrations selects the applied versions.
func (b *fleetSQL) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + b.migration + ` ORDER BY version`}
}

// RecordMigration records an applied version.
func (b *fleetSQL) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + b.migration + ` (version, name) VALUES (?, ?) ON CONFLICT (version) DO NOTHING`,
		Args: []any{version, name},
	}
}

// fleetTenantColumns are the columns every read of tenants selects
// first.
const fleetTenantColumns = `tenant, server_name, database_name, schema_name, removed_at IS NOT NULL`

// idsIn is the predicate "the tenant is one of the JSON array parameter".
const idsIn = `tenant IN (SELECT value FROM json_each(?))`

// jsonList renders v as a JSON array for json_each: one text parameter,
// so the SQL text is the same for any number of values.
func jsonList(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // strings and lists of strings always encode
	}
	return string(b)
}

// noLiveOwner is the predicate "the tenant has no live owner". NOT IN is
// exact here: instance is never NULL.
func (b *fleetSQL) noLiveOwner() string {
	return `(owner IS NULL OR owner NOT IN (SELECT instance FROM ` + b.members + ` WHERE expires_at > ` + now + `))`
}

// RenewMember extends a live member row.
func (b *fleetSQL) RenewMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.members + ` SET expires_at = ` + nowPlus + ` WHERE instance = ? AND expires_at > ` + now,
		Args: []any{offset(ttl), instance},
	}
}

// JoinMember upserts a member row.
func (b *fleetSQL) JoinMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + b.members + ` (instance, expires_at) VALUES (?, ` + nowPlus + `)
ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at`,
		Args: []any{instance, offset(ttl)},
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

// LockTenants selects tenants; the transaction holds the write lock
// already (BeginWrite).
func (b *fleetSQL) LockTenants(ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT ` + fleetTenantColumns + ` FROM ` + b.tenants + ` WHERE ` + idsIn + ` ORDER BY tenant`,
		Args: []any{jsonList(ids)},
	}
}

// InsertTenants upserts tenants in one statement, from a JSON array of
// rows. An upsert from a SELECT needs a WHERE clause, lest ON CONFLICT
// be read as a join's.
func (b *fleetSQL) InsertTenants(ts []sqladapters.FleetTenant) []sqladapters.Query {
	rows := make([][4]string, len(ts))
	for i, t := range ts {
		rows[i] = [4]string{t.ID, t.Server, t.Database, t.Schema}
	}
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + b.tenants + ` (tenant, server_name, database_name, schema_name)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]')
FROM json_each(?) WHERE true
ON CONFLICT (tenant) DO UPDATE SET server_name = excluded.server_name, database_name = excluded.database_name,
	schema_name = excluded.schema_name, removed_at = NULL`,
		Args: []any{jsonList(rows)},
	}}
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
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET removed_at = ` + now + ` WHERE ` + idsIn + ` AND removed_at IS NULL`,
		Args: []any{jsonList(ids)},
	}
}

// DeleteUnowned deletes removed tenants without a live owner.
func (b *fleetSQL) DeleteUnowned(ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE ` + idsIn + ` AND removed_at IS NOT NULL AND ` + b.noLiveOwner(),
		Args: []any{jsonList(ids)},
	}
}

// DeleteRemoved deletes an instance's removed tenants among ids.
func (b *fleetSQL) DeleteRemoved(instance string, ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE ` + idsIn + ` AND owner = ? AND removed_at IS NOT NULL`,
		Args: []any{jsonList(ids), instance},
	}
}

// ReleaseTenants clears the owner of an instance's tenants among ids.
func (b *fleetSQL) ReleaseTenants(instance string, ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET owner = NULL WHERE ` + idsIn + ` AND owner = ?`,
		Args: []any{jsonList(ids), instance},
	}
}

// Claim runs as one writer: its first statement, a delete, takes the
// write lock, so nothing changes under it and no row needs a lock of its
// own.
func (b *fleetSQL) Claim(instance string, max int) sqlstore.FleetClaim {
	free := `removed_at IS NULL AND ` + b.noLiveOwner()
	return sqlstore.FleetClaim{
		DeleteDead: sqladapters.Query{SQL: `DELETE FROM ` + b.members + ` WHERE expires_at <= ` + now},
		Member: sqladapters.Query{
			SQL:  `SELECT 1 FROM ` + b.members + ` WHERE instance = ? AND expires_at > ` + now,
			Args: []any{instance},
		},
		DeleteOrphans: sqladapters.Query{SQL: `DELETE FROM ` + b.tenants + ` WHERE removed_at IS NOT NULL AND ` + b.noLiveOwner()},
		Pick: sqladapters.Query{
			SQL:  `SELECT tenant FROM ` + b.tenants + ` WHERE ` + free + ` ORDER BY tenant LIMIT ?`,
			Args: []any{max},
		},
		Take: func(ids []string) sqladapters.Query {
			return sqladapters.Query{
				SQL: `UPDATE ` + b.tenants + ` SET owner = ? WHERE ` + idsIn + ` AND ` + free + `
RETURNING tenant, server_name, database_name, schema_name`,
				Args: []any{instance, jsonList(ids)},
			}
		},
	}
}
