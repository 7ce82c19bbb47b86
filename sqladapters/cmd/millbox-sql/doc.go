// Command millbox-sql prints the SQL that sqladapters.Migrate applies, for
// teams that run schema changes with their own tool (goose, atlas, flyway,
// Liquibase):
//
//	go run github.com/millbox/millbox/sqladapters/cmd/millbox-sql -db postgres -schema app > 0001_millbox.sql
//	go run github.com/millbox/millbox/sqladapters/cmd/millbox-sql -db mysql -outbox events_outbox
//
// The statements are idempotent (IF NOT EXISTS) and leave out Migrate's
// own bookkeeping (its lock and version table): pick one way to migrate and
// keep to it when upgrading millbox.
package main
