// Package stdsql adapts database/sql to millbox: a *sql.Tx becomes a
// sqladapters.Tx and a *sql.DB a sqladapters.DB. It works with any driver
// (pgx stdlib, lib/pq, go-sql-driver/mysql, SQLite); the dialect decides the
// SQL, this package only runs it.
package stdsql
