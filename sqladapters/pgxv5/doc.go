// Package pgxv5 adapts jackc/pgx v5 to millbox: a pgx.Tx becomes a
// sqladapters.Tx, and a *pgxpool.Pool or *pgx.Conn becomes a sqladapters.DB.
// The pool adapter also listens for Postgres notifications, which wakes the
// forwarder the moment an outbox write commits.
package pgxv5
