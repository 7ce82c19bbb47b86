package fleet

import (
	"context"
	"net"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/sqladapters"
)

// Tenant is one outbox of the fleet: a database of a server, or a schema
// in one, holding the millbox tables.
type Tenant struct {
	// ID is the application's name for the tenant, unique in the fleet:
	// at most 200 bytes of UTF-8 without NUL. It names the tenant in
	// Status, logs and metrics.
	ID string
	// Server names the database server the tenant lives on: a key of
	// Config.Servers. The catalog stores this name, never a connection
	// string.
	Server string
	// Database is the tenant's database on the server (a PostgreSQL or
	// MySQL database; on SQLite the file); "" is the server's default.
	Database string
	// Schema is the PostgreSQL schema holding the tenant's millbox
	// tables; "" is the connection's default (search_path). On MySQL the
	// database is the schema: leave it empty.
	Schema string
}

// Server is a database server tenants live on, as a driver package opens
// it: forwarder/fleet/pgfleet for PostgreSQL (pgx), forwarder/fleet/mysqlfleet
// for MySQL and MariaDB. Its methods are the fleet's: a Server is
// implemented by millbox's driver packages.
type Server interface {
	// Open returns a handle on database of the server. Every physical
	// connection the handle opens is dialled through dial, which counts
	// it against the fleet's connection budget; the handle keeps no idle
	// connection for longer than idle, so a tenant that has gone quiet
	// holds none.
	Open(ctx context.Context, database string, dial DialFunc, idle time.Duration) (Handle, error)
	// Dialect returns the dialect of the millbox tables of t on this
	// server (t.Schema applied): the same tables a plain forwarder of
	// that outbox would use.
	Dialect(t Tenant) (sqladapters.Dialect, error)
	// Doorbell returns what tells this server's tenants that rows came,
	// nil when the server has none (the tenants are then looked at by
	// the sweep and their timers only).
	Doorbell() Doorbell
	// SameDatabase tells whether two tenants of the server share one
	// database (and may share its connections): schemas of one
	// PostgreSQL database, or any two tenants of a MySQL server.
	SameDatabase(a, b Tenant) bool
}

// Handle is an open database of a server.
type Handle interface {
	// DB is the database, for the forwarder and the fleet's looks.
	DB() sqladapters.DB
	// Close closes the handle's connections.
	Close()
}

// DialFunc dials one physical connection to the server for a handle.
// The fleet's DialFunc takes a place in the connection budget (waiting for
// one until ctx ends) and gives it back when the connection is closed.
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// Doorbell watches a server and rings the tenants whose outbox may have
// new rows.
type Doorbell interface {
	// Watch rings tenants until ctx ends, and returns ctx's error or why
	// it cannot watch (then the fleet retries with backoff and falls back
	// to its sweep meanwhile).
	Watch(ctx context.Context, w Watch) error
}

// Watch is what a Doorbell is given.
type Watch struct {
	// Tenants returns the tenants of the server this instance serves
	// now; the set changes over time, and the doorbell follows it (it may
	// call Tenants as often as it looks).
	Tenants func() []Tenant
	// Ring tells that tenant (an ID of Tenants) may have new rows, or
	// delayed messages that came due. A ring may come before the commit
	// it announces: the fleet looks again shortly after. Safe from any
	// goroutine; it never blocks.
	Ring func(tenant string)
	// Gap tells that the doorbell may have missed rings (it reconnected,
	// its counters were reset): the fleet looks at every tenant of the
	// server.
	Gap func()
	// Dial dials the doorbell's own connection, counted apart from the
	// tenants' budget.
	Dial DialFunc
	// Logger receives the doorbell's logs.
	Logger watermill.LoggerAdapter
}
