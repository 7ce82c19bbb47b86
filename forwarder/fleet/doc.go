// Package fleet forwards a changing set of tenant outboxes — a database
// per tenant, or a schema per tenant, on one or more PostgreSQL and
// MySQL/MariaDB servers — from a set of instances that share the tenants,
// with a bounded number of connections: an idle tenant holds none, a busy
// one keeps the fast path of a single outbox.
//
// Each tenant's outbox lives in the tenant's own database, because it must
// commit with the tenant's data; a Fleet serves many of them the way one
// forwarder.Forwarder serves one: at least once, per-key order within a
// tenant, independent keys, dead letters, delayed messages and holds, as
// the single-outbox engine gives them. Config.Forwarder.ExactlyOnce passes
// on to each tenant's forwarder, but no test of the fleet covers exactly
// once into Kafka yet: rely on it only after testing it. It runs the
// single-outbox engine for a tenant while the tenant has messages, and
// nothing while it has none.
//
//	pg1, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dsn}) // tenants' server
//	...
//	fl, err := fleet.New(fleet.Config{
//		Control:     pgxv5.WrapPool(controlPool),
//		Store:       postgres.MustNewFleet(postgres.FleetOptions{}),
//		Servers:     map[string]fleet.Server{"pg1": pg1},
//		Tenants:     listTenants, // or write the catalog: fl.PutTenants
//		Destination: kafkaPublisher,
//	})
//	go func() { runErr <- fl.Run(ctx) }()
//
// # When to use it
//
// With tens of tenant outboxes or more. Below that, one forwarder per
// outbox per instance is simpler. The fleet trades a few hundred
// milliseconds on the first message of an idle tenant (a database
// tenant's connection is opened on demand) for not holding a connection
// and running a poller per tenant per instance: with one forwarder per
// tenant, 200 tenant databases and 3 instances are 600 pollers, each
// looking at its outbox every few milliseconds — more than a 2-core
// server does.
//
// # Tenants and leases
//
// The catalog of tenants (Tenant: an ID, the server, the database and
// schema) is a table in a control database the application already runs
// (Config.Control, Config.Store; create it with sqladapters.MigrateFleet).
// The application names its tenants through Config.Tenants, which the
// fleet reads every CatalogInterval and writes into the catalog, or
// writes the catalog itself (Fleet.PutTenants, Fleet.RemoveTenants). A
// tenant added is taken by an instance within CatalogInterval and looked
// at at once; a tenant removed is let go (its forwarder finishes its
// calls) and deleted from the catalog; its outbox is left as it is.
//
// Instances share the tenants by leases in the control database: an
// instance holds the tenants whose owner it is while its member row is
// live, renewed every LeaseTTL/3. Shares go by rank among the live
// members, so they add up to the tenants and a joining instance gets its
// share within a tick. An instance that dies or freezes loses its tenants
// to the others after LeaseTTL; it stops publishing at 90% of it by its
// own clock, so two instances never forward one tenant at once (short of
// a call in flight at that moment, which may repeat a message: at least
// once). At steady state an instance runs a heartbeat per renewal and two
// cheap queries a tick: no write per tenant. Fleet instances do not use
// the tenant outboxes' own lease tables: a tenant served by a fleet must
// not also be served by an ordinary forwarder.
//
// # Finding new rows: the wake-up path
//
// An idle tenant has no forwarder and no connection. It is woken by its
// server's doorbell, which one connection per server watches for all the
// server's tenants of this instance, and looked at by a slow sweep, which
// bounds what a doorbell may miss:
//
//   - PostgreSQL, a database per tenant (pgfleet.StatDoorbell): the
//     tup_inserted counter of each database in pg_stat_database, polled
//     every 250 ms; no privilege needed. It rings for any insert of the
//     database, and a backend that flushed its statistics less than a
//     second before its commit shows the commit up to 10 s later
//     (PostgreSQL's stats flush interval): postgres.Options.FlushStats
//     closes that hole at the price of a statistics flush in every outbox
//     insert.
//   - PostgreSQL, a schema per tenant (pgfleet.SlotDoorbell): a temporary
//     logical replication slot per database whose publication lists the
//     tenants' outbox tables: a commit rings its tenant within a few
//     milliseconds, and an idle database costs nothing. It needs
//     wal_level=logical and the REPLICATION attribute, as forwarder/cdc
//     does; each instance streams its own slot.
//   - MySQL/MariaDB (mysqlfleet): one query of the AUTO_INCREMENT of every
//     tenant's outbox in information_schema per server, every 250 ms to
//     1 s.
//
// A ring starts the tenant's forwarder at once. Its delayed messages and
// the retries of its failed rows are found by the tenant's own timers
// (the earliest due time seen at its last look) and by its forwarder,
// which stays while anything is pending. The sweep looks at every idle
// tenant once per SweepInterval (5 minutes): one cheap statement, on a
// connection that a database tenant must open for it.
//
// A busy tenant keeps the fast path: its forwarder (lanes, retries, dead
// letters, the breaker) runs with the high-water-mark watch and the
// doorbell's rings, until it has found no rows for its hold time — four
// times the smoothed time between its reads that found rows, between
// MinHold (2 s) and MaxHold (1 minute) — and nothing of its outbox is
// pending. Then it hands over and lets its connections go.
//
// # Connections
//
// Every connection to a tenant server is dialled through the fleet's
// budget: at most MaxConns per instance and MaxConnsPerServer per server
// per instance, counted as physical connections (a place is taken when a
// connection is dialled and given back when it closes), whatever the
// drivers' pools do. A tenant waiting for a place waits; the others go
// on. Tenants of one database (schemas) and of one MySQL server share one
// pool; a database per tenant has a pool of one connection by default
// (pgfleet.DefaultDatabaseMaxConns). A pool that holds connections and
// waits for the place of one more waits for that place even when one of
// its own connections is given back: pools that each do so can take
// every place and stall one another until a connection idles out, so
// keep the pools small against the budget. The doorbells' connections (one per server) and the control
// database's are not counted. So a fleet holds at most instances ×
// (MaxConns + servers) connections to the tenant servers, and with every
// tenant idle just the doorbells'.
//
// # Cost, measured
//
// integration/bench -case fleet measures it against the naive way (one
// forwarder per tenant per instance) on this repository's 2-core test
// machine; its README gives the figures. Costs that do not go away: the
// stat doorbell's query per server every 250 ms (a third of a millisecond
// of server CPU at 500 databases); the sweep's connection per database
// tenant per SweepInterval (a PostgreSQL connection costs tens of
// milliseconds of server CPU); the slot doorbell's decoding of the
// database's WAL (about 30 ms of server CPU per MB written).
//
// # Failures
//
// A tenant whose database is unreachable, or lacks its tables, holds back
// only itself: its looks back off (1 s doubling to a minute), Status and
// HealthHandler name it with the error, and Config.MigrateTenants
// migrates a tenant at its first look. A doorbell that stops (its server
// restarting, its counters reset) is restarted with backoff, and the
// server's tenants are all looked at meanwhile. The control database
// being unreachable stops the renewals: the instances stop publishing
// when their leases run out, and resume when it is back.
//
// # Operating
//
// Fleet.Status and HealthHandler report the tenants an instance holds,
// the largest backlog and the oldest pending message first, with totals.
// Config.TenantAttribute adds the tenant to the metrics of the tenants'
// forwarders, bounded by TenantAttrLimit.
//
// The millbox command (sqladapters/cmd/millbox) sees the whole fleet from
// the control database, whatever instance holds what. Since the catalog
// names servers and not connection strings, it takes each server's DSN
// from a --server name=DSN flag or from MILLBOX_FLEET_SERVERS (one
// name=DSN a line):
//
//	millbox status --fleet --dsn CONTROL_DSN --server pg1=DSN1 --server pg2=DSN2
//	millbox migrate up --fleet --dsn CONTROL_DSN --parallel 16
//
// status --fleet lists every tenant of the catalog with the live instance
// holding it and its pending rows and oldest pending age, read from the
// tenant's own outbox: the largest backlog and oldest pending message
// first, with totals and the tenants per live instance (--json for
// scripts). A tenant whose outbox cannot be read is listed as down with
// the error. migrate up --fleet creates or upgrades the control tables and
// then every tenant's tables (or those of the tenants listed in a file,
// --tenants), reporting each tenant and exiting with status 1 when any
// failed: the way to migrate before the fleet starts, rather than
// Config.MigrateTenants at each tenant's first look. Both visit --parallel
// tenants at once (8 by default).
//
// # Dependencies
//
// The package may import the forwarder (a tenant's forwarder is a
// forwarder.Forwarder), its polling source and telemetry, the source
// contract and the retry helper, sqladapters and startstop; its drivers
// (pgfleet, mysqlfleet) import it, never the reverse.
package fleet
