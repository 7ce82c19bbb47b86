// Package pgxv5 adapts jackc/pgx v5 to millbox: a pgx.Tx becomes a
// sqladapters.Tx, and a *pgxpool.Pool or *pgx.Conn becomes a sqladapters.DB.
// The pool adapter can also listen for Postgres notifications: with
// postgres.Options.Notify, that wakes the forwarder the moment an outbox
// write commits.
//
// Behind PgBouncer in transaction pooling, pgx's default cached prepared
// statements fail (PgBouncer before 1.21 moves a client between server
// connections): add default_query_exec_mode=exec (or simple_protocol) to
// the pool's connection string. LISTEN cannot work through such a pool
// either; give the listener a direct or session-pooled connection with
// ListenOn.
//
// # Failover
//
// Give the pool a multi-host connection string that asks for the server
// accepting writes, so that a new connection finds the primary wherever it
// is (see sqladapters/postgres, "Failover"):
//
//	postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write
//
// pgx checks target_session_attrs only when it opens a connection: a pool
// keeps the connections it has to a primary that died or became read-only.
// A DB made by WrapPool therefore drops every connection of its pool
// (pgxpool.Pool.Reset) when a statement of the DB, or of a transaction it
// began, fails in a way DropsConnection recognizes (the server ended the
// session, the connection broke, or a write was refused as read-only,
// SQLSTATE 25006); the next statements connect afresh. The application's
// own pool, whose transactions an outbox Publisher writes in, needs the
// same: begin them through the same DB (DB.Begin), or reset the pool when
// DropsConnection(err) is true.
package pgxv5
