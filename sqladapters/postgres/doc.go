// Package postgres is the PostgreSQL dialect of millbox: the outbox, lease
// and inbox tables, their migrations, and every statement the publisher,
// forwarder and inbox run, which it executes on the DB or transaction it is
// given (the store contract, sqladapters.Dialect). It imports no driver;
// pair it with sqladapters/pgxv5 or sqladapters/stdsql (pgx stdlib or
// lib/pq).
//
// Forwarders find new rows by watching the outbox's id sequence every few
// milliseconds (HighWaterMark). With Options.Notify the outbox insert also
// calls pg_notify, so forwarders listening on Dialect.NotifyChannel wake up
// as soon as the writing transaction commits, at the price of a lock that
// serializes committing transactions.
package postgres
