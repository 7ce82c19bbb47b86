// Package pgxv5 adapts jackc/pgx v5 to millbox: a pgx.Tx becomes a
// sqladapters.Tx, and a *pgxpool.Pool or *pgx.Conn becomes a sqladapters.DB.
// The pool adapter can also listen for Postgres notifications: with
// postgres.Options.Notify, that wakes the forwarder the moment an outbox
// write commits.
package pgxv5
