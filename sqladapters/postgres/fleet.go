package postgres

import (
	"cmp"
	"errors"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

const (
	// DefaultFleetPrefix starts the names of a fleet's control tables when
	// FleetOptions leaves Prefix empty.
	DefaultFleetPrefix = "millbox_fleet"
	// MaxFleetPrefixLength leaves room for the suffixes of the names
	// derived from FleetOptions.Prefix within Postgres' 63 bytes; the
	// same in every database package.
	MaxFleetPrefixLength = 40
)

// FleetOptions names the control tables of a forwarder fleet (see
// sqladapters.FleetStore).
type FleetOptions struct {
	// Schema holding the tables. Defaults to "" (unqualified names, found
	// through the connection's search_path). MigrateFleet creates it if
	// missing.
	Schema string
	// Prefix starts the names of the tables: <Prefix>_members,
	// <Prefix>_tenants, <Prefix>_version and <Prefix>_migrations. It must
	// not be the name of an outbox table in the same schema, whose tables
	// take such names. Defaults to DefaultFleetPrefix.
	Prefix string
}

// Fleet is the PostgreSQL implementation of sqladapters.FleetStore: the
// control tables of a forwarder fleet. Build it with NewFleet.
type Fleet struct {
	*fleetStore
	sql *fleetSQL
}

// fleetStore runs the statements of fleetSQL: the contract's methods.
type fleetStore = sqlstore.FleetStore

var _ sqladapters.FleetStore = (*Fleet)(nil)

// fleetSQL builds the PostgreSQL statements of the fleet's store.
type fleetSQL struct {
	opts                                  FleetOptions
	members, tenants, version, migrations string
}

// NewFleet validates opts, applies defaults and returns the store.
func NewFleet(opts FleetOptions) (*Fleet, error) {
	opts.Prefix = cmp.Or(opts.Prefix, DefaultFleetPrefix)
	if opts.Schema != "" {
		if err := sqladapters.ValidateIdentifier("postgres.FleetOptions.Schema", opts.Schema); err != nil {
			return nil, err
		}
	}
	if err := sqladapters.ValidateTableName("postgres.FleetOptions.Prefix", opts.Prefix, MaxFleetPrefixLength); err != nil {
		return nil, err
	}
	b := &fleetSQL{opts: opts}
	b.members = b.qualify(opts.Prefix + "_members")
	b.tenants = b.qualify(opts.Prefix + "_tenants")
	b.version = b.qualify(opts.Prefix + "_version")
	b.migrations = b.qualify(opts.Prefix + "_migrations")
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
	if b.opts.Schema == "" {
		return quote(name)
	}
	return quote(b.opts.Schema) + "." + quote(name)
}

// Name returns "postgres".
func (b *fleetSQL) Name() string { return "postgres" }

// ClassifyError classifies as the outbox's dialect does.
func (b *fleetSQL) ClassifyError(err error) error { return (&sqlDialect{}).ClassifyError(err) }

// RetryConflict tells a deadlock (40P01) or a serialization failure
// (40001): PostgreSQL rolled the transaction back for a concurrent one.
func (b *fleetSQL) RetryConflict(err error) bool {
	var se sqlStater
	if !errors.As(err, &se) {
		return false
	}
	return se.SQLState() == "40P01" || se.SQLState() == "40001"
}

// Tables returns the members, tenants, version and migrations tables.
func (b *fleetSQL) Tables() []string {
	return []string{b.members, b.tenants, b.version, b.migrations}
}

// Savepoint returns the statements of a savepoint.
func (b *fleetSQL) Savepoint() (set, rollback, release sqladapters.Query, ok bool) {
	return sqladapters.Query{SQL: `SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `ROLLBACK TO SAVEPOINT millbox_fleet`},
		sqladapters.Query{SQL: `RELEASE SAVEPOINT millbox_fleet`}, true
}

// IDsPerStatement returns 0: one text[] parameter carries any number.
func (b *fleetSQL) IDsPerStatement() int { return 0 }

// BeginWrite returns false: row locks let a transaction read, then wait
// to write.
func (b *fleetSQL) BeginWrite() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// Migrations lists the control tables' versions.
//
// The version starts from the clock in microseconds, so that tables
// created again never repeat a version an instance saw before.
func (b *fleetSQL) Migrations() []sqladapters.Migration {
	p := b.opts.Prefix
	return []sqladapters.Migration{{
		Version: 1,
		Name:    "fleet members, tenants and catalog version",
		Statements: []string{
			`CREATE TABLE IF NOT EXISTS ` + b.members + ` (
	instance   text        PRIMARY KEY,
	expires_at timestamptz NOT NULL
)`,
			`CREATE TABLE IF NOT EXISTS ` + b.tenants + ` (
	tenant        text PRIMARY KEY,
	server_name   text NOT NULL,
	database_name text NOT NULL,
	schema_name   text NOT NULL,
	owner         text,
	removed_at    timestamptz
)`,
			// An instance reads, releases and leaves its own tenants
			// through this index.
			`CREATE INDEX IF NOT EXISTS ` + quote(p+"_tenants_owner_idx") + ` ON ` + b.tenants + ` (owner)`,
			// Claims look for removed tenants nobody owns any more; the
			// index holds only removed ones.
			`CREATE INDEX IF NOT EXISTS ` + quote(p+"_tenants_removed_idx") + ` ON ` + b.tenants + ` (tenant) WHERE removed_at IS NOT NULL`,
			`CREATE TABLE IF NOT EXISTS ` + b.version + ` (
	id      integer PRIMARY KEY CHECK (id = 1),
	version bigint  NOT NULL
)`,
			`INSERT INTO ` + b.version + ` (id, version) VALUES (1, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
ON CONFLICT (id) DO NOTHING`,
		},
	}}
}

// LockMigrations takes a transaction-scoped advisory lock named after the
// schema and prefix.
func (b *fleetSQL) LockMigrations() (lock, unlock sqladapters.Query) {
	return sqladapters.Query{
		SQL:  `SELECT pg_advisory_xact_lock(hashtext($1))`,
		Args: []any{"millbox.fleet.migrate:" + b.opts.Schema + "." + b.opts.Prefix},
	}, sqladapters.Query{}
}

// CreateSchema creates FleetOptions.Schema, when set.
func (b *fleetSQL) CreateSchema() []sqladapters.Query {
	if b.opts.Schema == "" {
		return nil
	}
	return []sqladapters.Query{{SQL: `CREATE SCHEMA IF NOT EXISTS ` + quote(b.opts.Schema)}}
}

// ScriptNote says that the statements may run again.
func (b *fleetSQL) ScriptNote() string { return "Statements are idempotent." }

// CreateMigrationsTable creates the schema (when set) and the version
// table, refreshing the session's view of the schemas first (see
// sqlDialect.CreateMigrationsTable).
func (b *fleetSQL) CreateMigrationsTable() []sqladapters.Query {
	var qs []sqladapters.Query
	if b.opts.Schema != "" {
		qs = append(qs, sqladapters.Query{SQL: `SELECT FROM pg_catalog.pg_namespace LIMIT 0`})
		qs = append(qs, b.CreateSchema()...)
	}
	return append(qs, sqladapters.Query{SQL: `CREATE TABLE IF NOT EXISTS ` + b.migrations + ` (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`})
}

// AppliedMigrations selects the applied versions.
func (b *fleetSQL) AppliedMigrations() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT version FROM ` + b.migrations + ` ORDER BY version`}
}

// RecordMigration records an applied version.
func (b *fleetSQL) RecordMigration(version int, name string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `INSERT INTO ` + b.migrations + ` (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING`,
		Args: []any{version, name},
	}
}

// liveOwner is the predicate "tenant alias t has a live owner".
func (b *fleetSQL) liveOwner(t string) string {
	return `EXISTS (SELECT 1 FROM ` + b.members + ` m WHERE m.instance = ` + t + `.owner AND m.expires_at > now())`
}

// fleetTenantColumns are the columns every read of tenants selects
// first.
const fleetTenantColumns = `tenant, server_name, database_name, schema_name, removed_at IS NOT NULL`

// RenewMember extends a live member row.
func (b *fleetSQL) RenewMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.members + ` SET expires_at = now() + $2 * interval '1 microsecond' WHERE instance = $1 AND expires_at > now()`,
		Args: []any{instance, micros(ttl)},
	}
}

// JoinMember upserts a member row.
func (b *fleetSQL) JoinMember(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + b.members + ` (instance, expires_at) VALUES ($1, now() + $2 * interval '1 microsecond')
ON CONFLICT (instance) DO UPDATE SET expires_at = EXCLUDED.expires_at`,
		Args: []any{instance, micros(ttl)},
	}
}

// LiveMembers selects the live members.
func (b *fleetSQL) LiveMembers() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT instance FROM ` + b.members + ` WHERE expires_at > now()`}
}

// RemoveMember deletes a member row.
func (b *fleetSQL) RemoveMember(instance string) sqladapters.Query {
	return sqladapters.Query{SQL: `DELETE FROM ` + b.members + ` WHERE instance = $1`, Args: []any{instance}}
}

// ReleaseAll clears the owner of an instance's tenants.
func (b *fleetSQL) ReleaseAll(instance string) sqladapters.Query {
	return sqladapters.Query{SQL: `UPDATE ` + b.tenants + ` SET owner = NULL WHERE owner = $1`, Args: []any{instance}}
}

// DeleteOwnedRemoved deletes an instance's removed tenants.
func (b *fleetSQL) DeleteOwnedRemoved(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE owner = $1 AND removed_at IS NOT NULL`,
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
FROM ` + b.tenants + ` t LEFT JOIN ` + b.members + ` m ON m.instance = t.owner AND m.expires_at > now()`}
}

// OwnedTenants selects the tenants of a live instance.
func (b *fleetSQL) OwnedTenants(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT ` + fleetTenantColumns + ` FROM ` + b.tenants + `
WHERE owner = $1 AND EXISTS (SELECT 1 FROM ` + b.members + ` WHERE instance = $1 AND expires_at > now())`,
		Args: []any{instance},
	}
}

// LockTenants selects and locks tenants in ID order.
func (b *fleetSQL) LockTenants(ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT ` + fleetTenantColumns + ` FROM ` + b.tenants + ` WHERE tenant = ANY($1::text[]) ORDER BY tenant FOR UPDATE`,
		Args: []any{textArray(ids)},
	}
}

// InsertTenants upserts tenants in one statement, from one array per
// column.
func (b *fleetSQL) InsertTenants(ts []sqladapters.FleetTenant) []sqladapters.Query {
	cols := [4][]string{}
	for _, t := range ts {
		cols[0] = append(cols[0], t.ID)
		cols[1] = append(cols[1], t.Server)
		cols[2] = append(cols[2], t.Database)
		cols[3] = append(cols[3], t.Schema)
	}
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + b.tenants + ` (tenant, server_name, database_name, schema_name)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
ON CONFLICT (tenant) DO UPDATE SET server_name = EXCLUDED.server_name, database_name = EXCLUDED.database_name,
	schema_name = EXCLUDED.schema_name, removed_at = NULL`,
		Args: []any{textArray(cols[0]), textArray(cols[1]), textArray(cols[2]), textArray(cols[3])},
	}}
}

// UpdateTenant changes a tenant and brings it back.
func (b *fleetSQL) UpdateTenant(t sqladapters.FleetTenant) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET server_name = $2, database_name = $3, schema_name = $4, removed_at = NULL WHERE tenant = $1`,
		Args: []any{t.ID, t.Server, t.Database, t.Schema},
	}
}

// MarkRemoved marks tenants removed.
func (b *fleetSQL) MarkRemoved(ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET removed_at = now() WHERE tenant = ANY($1::text[]) AND removed_at IS NULL`,
		Args: []any{textArray(ids)},
	}
}

// DeleteUnowned deletes removed tenants without a live owner.
func (b *fleetSQL) DeleteUnowned(ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `DELETE FROM ` + b.tenants + ` t WHERE t.tenant = ANY($1::text[]) AND t.removed_at IS NOT NULL
AND NOT ` + b.liveOwner("t"),
		Args: []any{textArray(ids)},
	}
}

// DeleteRemoved deletes an instance's removed tenants among ids.
func (b *fleetSQL) DeleteRemoved(instance string, ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + b.tenants + ` WHERE tenant = ANY($2::text[]) AND owner = $1 AND removed_at IS NOT NULL`,
		Args: []any{instance, textArray(ids)},
	}
}

// ReleaseTenants clears the owner of an instance's tenants among ids.
func (b *fleetSQL) ReleaseTenants(instance string, ids []string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + b.tenants + ` SET owner = NULL WHERE owner = $1 AND tenant = ANY($2::text[])`,
		Args: []any{instance, textArray(ids)},
	}
}

// Claim picks tenants with FOR UPDATE SKIP LOCKED, walking the primary
// key in order, and takes them with UPDATE ... RETURNING. now() is the
// transaction's start throughout, so every statement of the claim judges
// the members by one clock reading.
func (b *fleetSQL) Claim(instance string, max int) sqlstore.FleetClaim {
	free := `c.removed_at IS NULL AND (c.owner IS NULL OR NOT ` + b.liveOwner("c") + `)`
	return sqlstore.FleetClaim{
		DeleteDead: sqladapters.Query{SQL: `DELETE FROM ` + b.members + ` WHERE expires_at <= now()`},
		// KEY SHARE keeps the row from being deleted and lets renewals
		// through.
		Member: sqladapters.Query{
			SQL:  `SELECT 1 FROM ` + b.members + ` WHERE instance = $1 AND expires_at > now() FOR KEY SHARE`,
			Args: []any{instance},
		},
		DeleteOrphans: sqladapters.Query{SQL: `DELETE FROM ` + b.tenants + ` c WHERE c.removed_at IS NOT NULL
AND (c.owner IS NULL OR NOT ` + b.liveOwner("c") + `)`},
		Pick: sqladapters.Query{
			SQL:  `SELECT c.tenant FROM ` + b.tenants + ` c WHERE ` + free + ` ORDER BY c.tenant LIMIT $1 FOR UPDATE OF c SKIP LOCKED`,
			Args: []any{max},
		},
		Take: func(ids []string) sqladapters.Query {
			return sqladapters.Query{
				SQL: `UPDATE ` + b.tenants + ` c SET owner = $1 WHERE c.tenant = ANY($2::text[]) AND ` + free + `
RETURNING c.tenant, c.server_name, c.database_name, c.schema_name`,
				Args: []any{instance, textArray(ids)},
			}
		},
	}
}
