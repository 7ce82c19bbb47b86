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
package pgxv5
