// Package sqladapters holds the small database interfaces the rest of millbox
// talks to, the SQL dialect contract, and the embedded-migration runner.
//
// Nothing here imports a database driver. Each driver lives in its own
// subpackage and turns what the application already holds into these
// interfaces:
//
//   - sqladapters/pgxv5: pgx.Tx, *pgxpool.Pool, *pgx.Conn
//   - sqladapters/stdsql: *sql.Tx, *sql.DB (pgx stdlib, lib/pq, go-sql-driver/mysql, SQLite)
//   - sqladapters/wmsql: watermill-sql/v4's sql.Tx and sql.Beginner
//
// Dialects build SQL without executing it, so the SQL of every database lives
// in one reviewable place per database:
//
//   - sqladapters/postgres
//   - sqladapters/mysql
//   - sqladapters/sqlite
//
// A transaction travels to the outbox publisher and to inbox handlers through
// a context.Context: see WithTx and TxFromContext.
package sqladapters
