package sqladapters

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// FleetStore is the store contract of a forwarder fleet's control tables:
// the catalog of the fleet's tenants and the leases through which the
// fleet's instances share them, kept in a database the application already
// runs (the control database, not a tenant's). Choosing a database is one
// constructor: postgres.NewFleet, mysql.NewFleet or sqlite.NewFleet.
//
// Members and leases: every instance renews one member row (Heartbeat);
// a tenant belongs to the instance that claimed it while that instance's
// member row is live, so renewing costs one row however many tenants the
// instance holds. An instance whose member row expired owns nothing any
// more: the others may claim its tenants, and its next Heartbeat reports
// that it starts afresh. An instance counts a tenant as its own only from
// a Heartbeat that renewed (or began) its membership until that
// Heartbeat's start plus less than its ttl on its own clock, and stops
// serving the tenant before then unless a later Heartbeat renewed.
//
// Catalog: PutTenants and RemoveTenants change it, and CatalogVersion
// moves with every change, so that instances re-read the catalog and
// their tenants only when it moved. A removed tenant stays in the catalog
// until its owner has let go of it and deletes it (DeleteRemoved); one
// that no live instance owns is deleted at once.
//
// Instance names and tenant IDs are at most MaxFleetNameBytes of UTF-8
// without NUL, compared byte for byte. Every method maps the driver's
// errors as a Dialect's do: a missing table is a *MissingTableError
// (with Fleet set) that says how to migrate.
//
// FleetStore is implemented by millbox's own database packages and may
// gain methods in any release: use it, do not implement it.
type FleetStore interface {
	// Name is a short name of the database, such as "postgres".
	Name() string
	// ClassifyError maps a driver error from a statement on this
	// database to millbox's errors (see Dialect.ClassifyError).
	ClassifyError(err error) error
	// Tables returns the quoted, qualified names of the control tables.
	Tables() []string

	// Migrations lists the control tables' migrations in version order.
	Migrations() []Migration
	// AppliedMigrations returns the versions Migrate recorded as applied,
	// ascending; a *MissingTableError when it never ran.
	AppliedMigrations(ctx context.Context, e Executor) ([]int, error)
	// MigrationScript renders the control tables as one SQL script, for
	// migration tools, as Dialect.MigrationScript does for an outbox.
	MigrationScript() string
	// Migrate applies in tx those of migrations that are not applied yet,
	// under a lock that serializes concurrent migrators. Use
	// MigrateFleet, which passes Migrations().
	Migrate(ctx context.Context, tx Tx, migrations []Migration) error

	// Heartbeat renews the membership of instance for ttl and reports
	// whether it renewed a live one. When instance had no live member row
	// (it is new, left, or its row expired) it joins afresh: Heartbeat
	// releases, in the same transaction, every tenant still recorded as
	// the instance's, and returns false; the instance owns nothing then
	// and claims anew. At steady state it is one UPDATE of one row.
	// Instance names must be unique per process.
	Heartbeat(ctx context.Context, e Executor, instance string, ttl time.Duration) (renewed bool, err error)
	// LiveMembers returns the names of the instances whose member rows
	// are live, in byte order, as every instance sees them: one cheap
	// query.
	LiveMembers(ctx context.Context, e Executor) ([]string, error)
	// Leave ends the membership of instance at once: it deletes its
	// member row, the removed tenants it owned, and releases its other
	// tenants, in one transaction, so that the others claim them without
	// waiting for the row to expire. Call it once the instance serves no
	// tenant any more.
	Leave(ctx context.Context, e Executor, instance string) error

	// PutTenants adds tenants to the catalog or updates them (ID is the
	// key), in one transaction: a removed tenant put again comes back, and
	// a tenant keeps its owner. Only a tenant that changed moves
	// CatalogVersion. Removed and Owner must be unset: RemoveTenants
	// removes, and claims own. An ID given twice is refused. Concurrent
	// puts of one new tenant through callers' transactions may fail with
	// ErrDuplicate (or a deadlock on MySQL): run the transaction again.
	PutTenants(ctx context.Context, e Executor, tenants []FleetTenant) error
	// RemoveTenants marks the tenants ids removed, in one transaction:
	// their owners let go of them and delete them (DeleteRemoved); those
	// no live instance owns are deleted at once. IDs not in the catalog,
	// or removed already, change nothing.
	RemoveTenants(ctx context.Context, e Executor, ids []string) error
	// CatalogVersion returns a number that changes with every change of
	// the catalog (a tenant added, changed, removed or deleted) and with
	// nothing else: not with claims, releases or heartbeats. One cheap
	// query. Its first value comes from the clock when the tables are
	// created, so tables created again do not repeat a version an
	// instance saw.
	CatalogVersion(ctx context.Context, e Executor) (int64, error)
	// Tenants returns the whole catalog in ID order, each tenant with its
	// live owner ("" when no live instance owns it), for status.
	Tenants(ctx context.Context, e Executor) ([]FleetTenant, error)
	// OwnedTenants returns the tenants instance owns, in ID order, the
	// removed ones among them (Removed set; let go of them and delete
	// them); none when its member row is not live.
	OwnedTenants(ctx context.Context, e Executor, instance string) ([]FleetTenant, error)

	// ClaimTenants gives instance up to max tenants that are not removed
	// and that no live instance owns, and returns them in ID order. It
	// runs its own transaction on db. Concurrent claims never give a
	// tenant to two live instances: claimers skip the tenants another is
	// claiming where the database has SKIP LOCKED, and wait for them
	// elsewhere; a claim also waits for a renewal of a member row that
	// was under way as the row expired, and then leaves that member its
	// tenants. Instance must be a live member (Heartbeat first): otherwise
	// it fails with ErrNotFleetMember. It also deletes the removed tenants
	// no live instance owns (their owner stopped before deleting them).
	ClaimTenants(ctx context.Context, db DB, instance string, max int) ([]FleetTenant, error)
	// ReleaseTenants gives up the tenants ids that instance owns, so that
	// others may claim them; it leaves any other tenant alone. Release a
	// tenant only once the instance stopped serving it.
	ReleaseTenants(ctx context.Context, e Executor, instance string, ids []string) error
	// DeleteRemoved deletes from the catalog those of the tenants ids that
	// are removed and owned by instance, which let go of them, and reports
	// how many it deleted. A tenant put again meanwhile stays, still the
	// instance's.
	DeleteRemoved(ctx context.Context, e Executor, instance string, ids []string) (int64, error)
}

// FleetTenant is one tenant of a fleet's catalog: an outbox in a database
// (or a schema of one) of a server the application names.
type FleetTenant struct {
	// ID is the application's name for the tenant, unique in the fleet:
	// at most MaxFleetNameBytes of UTF-8 without NUL, not empty.
	ID string
	// Server names the database server the tenant lives on: a name the
	// application resolves to a connection, never a connection string. At
	// most MaxFleetNameBytes of UTF-8 without NUL.
	Server string
	// Database is the tenant's database on the server ("" is the
	// server's default; on SQLite the file). At most MaxFleetPathBytes of
	// UTF-8 without NUL.
	Database string
	// Schema is the PostgreSQL schema holding the tenant's tables ("" is
	// the connection's default). At most MaxFleetPathBytes of UTF-8
	// without NUL.
	Schema string
	// Removed tells that RemoveTenants removed the tenant and its owner
	// has not deleted it yet. Read only.
	Removed bool
	// Owner is the live instance that owns the tenant, "" when none. Read
	// only: Tenants fills it in, and OwnedTenants and ClaimTenants with
	// the instance asked for.
	Owner string
}

const (
	// MaxFleetNameBytes is the longest tenant ID, server name and
	// instance name of a fleet, in bytes of UTF-8.
	MaxFleetNameBytes = 200
	// MaxFleetPathBytes is the longest FleetTenant.Database and Schema,
	// in bytes of UTF-8: a SQLite tenant's database is a file's path.
	MaxFleetPathBytes = 4096
)

var (
	// ErrInvalidTenant is returned for a FleetTenant, or a tenant ID,
	// that the catalog cannot hold; the error names the field and the
	// rule.
	ErrInvalidTenant = errors.New("millbox: invalid tenant")

	// ErrNotFleetMember is returned by FleetStore.ClaimTenants for an
	// instance whose member row is not live: a tenant it claimed would be
	// free for the others at once.
	ErrNotFleetMember = errors.New("millbox: fleet: not a live member")
)

// Validate checks that the catalog can hold t: an ID, names and paths
// of valid UTF-8 without NUL within their lengths, and Removed and Owner
// unset. The error wraps ErrInvalidTenant.
func (t FleetTenant) Validate() error {
	if err := ValidateTenantID(t.ID); err != nil {
		return err
	}
	for _, f := range []struct {
		field, value string
		max          int
	}{
		{"Server", t.Server, MaxFleetNameBytes},
		{"Database", t.Database, MaxFleetPathBytes},
		{"Schema", t.Schema, MaxFleetPathBytes},
	} {
		if err := checkFleetText(f.value, f.max); err != nil {
			return fmt.Errorf("%w %q: FleetTenant.%s %s", ErrInvalidTenant, clip(t.ID), f.field, err)
		}
	}
	if t.Removed {
		return fmt.Errorf("%w %q: FleetTenant.Removed is set: remove a tenant with RemoveTenants", ErrInvalidTenant, clip(t.ID))
	}
	if t.Owner != "" {
		return fmt.Errorf("%w %q: FleetTenant.Owner is set: instances own tenants by claiming them", ErrInvalidTenant, clip(t.ID))
	}
	return nil
}

// ValidateTenantID checks that id can name a tenant of a fleet: not
// empty, at most MaxFleetNameBytes of valid UTF-8 without NUL. The error
// wraps ErrInvalidTenant.
func ValidateTenantID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: the tenant ID is empty", ErrInvalidTenant)
	}
	if err := checkFleetText(id, MaxFleetNameBytes); err != nil {
		return fmt.Errorf("%w: tenant ID %q %s", ErrInvalidTenant, clip(id), err)
	}
	return nil
}

// ValidateFleetInstance checks that name can name an instance of a
// fleet, with the rule of tenant IDs. The error wraps ErrInvalidConfig:
// the name comes from the fleet's configuration.
func ValidateFleetInstance(name string) error {
	if name == "" {
		return fmt.Errorf("%w: the fleet instance name is empty", ErrInvalidConfig)
	}
	if err := checkFleetText(name, MaxFleetNameBytes); err != nil {
		return fmt.Errorf("%w: fleet instance name %q %s", ErrInvalidConfig, clip(name), err)
	}
	return nil
}

// checkFleetText says what keeps s from a text column of the control
// tables, in words that follow a name (nil when nothing does).
func checkFleetText(s string, max int) error {
	switch {
	case len(s) > max:
		return fmt.Errorf("is %d bytes long, more than %d", len(s), max)
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("holds a NUL byte")
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
