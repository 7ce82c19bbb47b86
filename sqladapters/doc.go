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
// record an inbox id, ...) runs its own SQL, scans its rows and maps the
// driver's errors, so the publisher, the forwarder and the inbox never build
// SQL or look at driver errors. One package per database implements it:
//
//   - sqladapters/postgres
//   - sqladapters/mysql
//   - sqladapters/sqlite
//
// All three pass one conformance suite of the contract.
//
// A transaction travels to the outbox publisher and to inbox handlers through
// a context.Context: see WithTx and TxFromContext.
package sqladapters
