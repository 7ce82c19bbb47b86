// Package pgfleet is the PostgreSQL driver of the fleet (package
// forwarder/fleet), on pgx v5: a Server opens the tenants' databases as
// small pgxpool pools whose every connection is dialled through the
// fleet's budget and closed once idle, gives each tenant the postgres
// dialect of its schema, and tells the fleet which tenants got rows.
//
//	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{
//		DSN:      "postgres://app@db1:5432/postgres",
//		Doorbell: pgfleet.StatDoorbell, // a database per tenant
//	})
//
// # Doorbells
//
// A fleet keeps no connection to an idle tenant, so it must learn from
// elsewhere that one wrote. ServerConfig.Doorbell chooses how:
//
//   - StatDoorbell, for a database per tenant: one connection per server
//     reads the databases' insert counters in pg_stat_database every
//     DoorbellInterval (250 ms) and rings the databases whose counter
//     moved. It needs no privilege and costs about 0.3 ms of server CPU
//     per look at 500 databases. It rings for every insert of the
//     database, and a session reports its counters at most once a
//     second when it goes idle, otherwise 10 s later: set
//     postgres.Options.FlushStats in the tenants' publishers
//     (PostgreSQL 15+) so that every commit is counted at once.
//   - SlotDoorbell, for tenants that are schemas of one database: a
//     temporary logical replication slot per database streams the
//     inserts into the tenants' outbox and scheduled tables, a
//     publication the doorbell keeps in step with the tenants; rings
//     come milliseconds after the commit, for those tables only. It
//     needs wal_level=logical and a role with REPLICATION that owns the
//     tenants' tables, and costs a walsender that decodes the server's
//     WAL (about 29 ms of CPU per MB) while idle costs nothing. Every
//     instance of the fleet streams a slot of its own for its own
//     tenants: a single holder relaying rings to the other instances
//     would decode the WAL once instead of once per instance, and is a
//     later optimisation.
//   - NoDoorbell: the fleet's sweep and timers only.
//
// What each doorbell costs and can miss is told in full with its code
// (statbell.go, slotbell.go); the fleet's sweep bounds what they miss.
//
// # Connections
//
// A handle (Server.Open) is a pgxpool pool on one database with MinConns
// 0, at most ServerConfig.MaxConns connections and MaxConnIdleTime set
// to the idle time the fleet gives: a connection unused for that long is
// closed at the next health check (every HealthCheckPeriod, by default
// half the idle time), so a tenant that went quiet holds none. Every
// connection, of every host of a multi-host DSN, is dialled through the
// fleet's DialFunc, and carries ServerConfig.ApplicationName
// (DefaultApplicationName), by which pg_stat_activity counts them; the
// doorbells' connections end with DoorbellSuffix.
package pgfleet
