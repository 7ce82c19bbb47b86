// Package stdsql adapts database/sql to millbox: a *sql.Tx becomes a
// sqladapters.Tx and a *sql.DB a sqladapters.DB. It works with any driver
// (pgx stdlib, lib/pq, go-sql-driver/mysql, SQLite); the dialect decides the
// SQL, this package only runs it.
//
// A DB takes a connection of its pool for each statement and transaction,
// and discards it, instead of giving it back, when it failed in a way
// DropsConnection recognizes: on PostgreSQL, a server that ended the
// session or became read-only (a primary that was demoted or fenced). New
// connections of a multi-host connection string with
// target_session_attrs=read-write then find the new primary (see
// sqladapters/postgres, "Failover").
package stdsql
