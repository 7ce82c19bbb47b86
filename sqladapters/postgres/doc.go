// Package postgres is the PostgreSQL dialect of millbox: the outbox, lease
// and inbox tables, their migrations, and every statement the publisher,
// forwarder and inbox run. It builds SQL only and imports no driver; pair it
// with sqladapters/pgxv5 or sqladapters/stdsql (pgx stdlib or lib/pq).
//
// The outbox insert also calls pg_notify, so forwarders listening on
// Dialect.NotifyChannel wake up as soon as the writing transaction commits.
package postgres
