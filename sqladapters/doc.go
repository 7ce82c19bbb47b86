// Package sqladapters holds the small database interfaces the rest of millbox
// talks to, the store contract (Dialect), and the migration runner.
//
// Nothing here imports a database driver. Each driver lives in its own
// subpackage and turns what the application already holds into these
// interfaces:
//
//   - sqladapters/pgxv5: pgx.Tx, *pgxpool.Pool, *pgx.Conn
//   - sqladapters/stdsql: *sql.Tx, *sql.DB (pgx stdlib, lib/pq, go-sql-driver/mysql, SQLite)
//   - sqladapters/wmsql: watermill-sql/v4's sql.Tx and sql.Beginner
//
// A Dialect is the store contract for one database: each of its operations
// (write messages, read pending rows, record a failure, lease partitions,
// record an inbox id, the operations' status, dead-letter pages, requeue,
// discard and prune, ...) runs its own SQL, scans its rows and maps the
// driver's errors (a missing table becomes a *MissingTableError that says
// how to migrate, a unique violation wraps ErrDuplicate), so the
// publisher, the forwarder, the inbox and the operations never build SQL
// or look at driver errors. One package per database implements it, and
// choosing a database is one constructor:
//
//   - sqladapters/postgres: PostgreSQL 13 or later
//   - sqladapters/mysql: MySQL 5.7 or later, MariaDB 10.2 or later
//   - sqladapters/sqlite: SQLite 3.38 or later (sqladapters/sqlite/modernc
//     opens a database with the pure-Go driver)
//
// Use the contract, do not implement it: it is implemented by millbox's
// own database packages and may gain methods in any release. All three
// pass one conformance suite of the contract, on every driver (pgx,
// database/sql with pgx stdlib and lib/pq, watermill-sql's wrappers), and
// the same suites of the publisher, the forwarder and the inbox.
//
// # Differences between databases
//
// Dialect.Features reports them. In short:
//
//   - Migrations in the caller's transaction (MigrateTx): PostgreSQL and
//     SQLite; MySQL commits DDL implicitly.
//   - Finding new rows: every database's forwarder watches the outbox's
//     high-water mark every few milliseconds and is woken at once by a
//     publisher in the same process; PostgreSQL can also notify other
//     processes (postgres.Options.Notify).
//   - Concurrent writers: PostgreSQL and MySQL; SQLite serializes write
//     transactions.
//   - Partition claims of the forwarder: lease rows everywhere; SKIP
//     LOCKED on PostgreSQL, and on MySQL 8.0.1+ and MariaDB 10.6+ with
//     mysql.Options.SkipLocked.
//   - PostgreSQL only: reads that start past the rows already forwarded
//     (Features.Horizon), the time-partitioned outbox and change data
//     capture (forwarder/cdc).
//
// # Migrations
//
// Migrate brings the tables up to date and is safe to run from every
// instance at start: migrators take a lock, and applied versions are
// skipped. MigrateTx runs the migrations inside the caller's transaction.
// For schema tools such as goose, atlas or flyway, MigrationSQL returns
// the script instead (`millbox migrate sql` prints it). An application
// that only publishes sets WithoutInbox in its dialect's options; a later
// migration without it adds the inbox table.
//
// Schema and table names come from the dialect's options; they must be
// plain identifiers ([A-Za-z_][A-Za-z0-9_]*), are quoted, and anything
// else is refused with ErrInvalidName.
//
// # A fleet's control tables
//
// A forwarder fleet serves many tenant outboxes with a few instances. Its
// catalog of tenants and the leases through which the instances share
// them live in a database the application already runs, behind a second,
// smaller contract: FleetStore (postgres.NewFleet, mysql.NewFleet,
// sqlite.NewFleet). An instance renews one member row; a tenant belongs
// to the instance that claimed it while that row is live, so the cost of
// the leases does not grow with the tenants. MigrateFleet creates the
// tables, as Migrate does an outbox's, and each store's MigrationScript
// renders them for migration tools. One conformance suite runs it on
// every database and driver.
//
// A transaction travels to the outbox publisher and to inbox handlers through
// a context.Context: see WithTx and TxFromContext.
package sqladapters
