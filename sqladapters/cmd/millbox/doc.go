// Command millbox operates a millbox installation from a terminal: it
// creates the tables, shows the backlog, finds, explains, requeues and
// discards dead letters, and prunes forwarded rows and old inbox records,
// on PostgreSQL, MySQL/MariaDB and SQLite.
//
// Install it, or run it from any module:
//
//	go install github.com/millbox/millbox/sqladapters/cmd/millbox@latest
//	go run github.com/millbox/millbox/sqladapters/cmd/millbox@latest help
//
// The database is chosen by the form of --dsn (or MILLBOX_DSN):
//
//	export MILLBOX_DSN='postgres://app@db:5432/app?sslmode=disable'
//	millbox migrate up
//	millbox status
//	millbox dead list --group-by-error
//	millbox dead show 1234
//	millbox dead requeue --error 'connection refused' --yes
//	millbox prune --forwarded-older-than 7d --inbox-older-than 30d
//
// For teams that run schema changes with their own tool, `millbox migrate
// sql` prints the complete SQL (CREATE SCHEMA included) without connecting.
//
// Run `millbox help` for every command and flag. Exit status: 0 on
// success, 1 when an operation failed, 2 for a usage error or a change
// refused without --yes.
package main
