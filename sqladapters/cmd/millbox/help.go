package main

import (
	"context"
	"fmt"
)

const mainUsage = `millbox operates a millbox transactional outbox and inbox: tables, backlog,
dead letters, requeue and pruning, on PostgreSQL, MySQL/MariaDB and SQLite.

Usage:
  millbox <command> [flags]

Commands:
  migrate up        create or upgrade the millbox tables (idempotent, safe from many processes)
  migrate sql       print the complete SQL, for your own migration tool; no connection needed
  status            backlog per topic, oldest pending age, dead letters, kept rows,
                    inbox records and partition owners (--json for scripts)
  status --fleet    every tenant of a forwarder fleet: the instance holding it, its backlog
                    and oldest pending age, the largest first, with totals
  migrate up --fleet
                    create or upgrade the tables of every tenant of a fleet, in parallel
  dead list         list dead letters, filtered, or grouped by error (--group-by-error)
  dead show ID      one dead letter with its error, metadata and payload
  dead held         keys held by dead letters, with the messages waiting behind each
  dead requeue      send dead letters again (--dry-run to count, --yes for a filter or --all)
  dead discard      delete dead letters (--dry-run to count, --yes to do it)
  prune             delete forwarded rows kept for audit and old inbox records, in batches
  partitions list   the partitions of a time-partitioned Postgres outbox, with their rows
  partitions maintain
                    create partitions ahead, drop those past retention (Postgres)
  version           print the version
  help [command]    explain a command

The database is chosen by the form of --dsn, or of $MILLBOX_DSN:
` + dsnForms + `

The table flags (--schema, --outbox-table, --inbox-table) must match the options your
application gives the dialect (postgres.Options, mysql.Options, sqlite.Options). Errors
name the schema looked in, and hints repeat the flags you gave, the DSN's password masked.
Text output shows control characters from the database as escapes (\x1b).

Examples:
  export MILLBOX_DSN='postgres://app@localhost:5432/app?sslmode=disable'
  millbox migrate up --schema messaging
  millbox migrate sql --dsn 'postgres://localhost/app' --schema messaging > 0001_millbox.sql
  millbox status
  millbox status --json | jq .pending
  millbox dead list --group-by-error
  millbox dead list --topic orders --error timeout --newer-than 1h
  millbox dead show 1234
  millbox dead requeue 1234 1235
  millbox dead requeue --error 'connection refused' --dry-run
  millbox dead requeue --error 'connection refused' --yes
  millbox dead discard --topic test.events --older-than 30d --yes
  millbox prune --forwarded-older-than 7d --inbox-older-than 30d
  millbox status --fleet --dsn 'postgres://app@control/app' --server pg1='postgres://app@db1/postgres'

Run 'millbox help <command>' or 'millbox <command> --help' for its flags. Flags take one
dash or two (-dsn, --dsn) and may follow the arguments.
Exit status: 0 success, 1 failure, 2 usage error or change refused without --yes.
`

const migrateUsage = `Usage:
  millbox migrate up  [flags]   create or upgrade the tables in the database
  millbox migrate sql [flags]   print the SQL instead, for goose, atlas, flyway, Liquibase...

'migrate up' is idempotent and safe to run from several processes at once: migrators
take a lock, and versions already applied are skipped. It records applied versions in
<outbox-table>_migrations.

'migrate sql' prints every statement, CREATE SCHEMA (Postgres) or CREATE DATABASE
(MySQL) included when --schema is set. It needs no connection: the database comes from
--dsn or from --db. Its statements are idempotent; pick one way to migrate and keep to it.

--partitioned (PostgreSQL) creates the outbox as a table partitioned by creation time,
one partition per --interval (default 24h), for outboxes whose forwarded rows are kept
for audit or that may hold tens of millions of rows; see 'millbox help partitions'. It
chooses the layout of a new installation; an existing outbox keeps its layout. Forwarders
and publishers then need postgres.Options{Partitioned: ...} with the same interval.

--without-inbox leaves the inbox table out, for an application that only publishes; a
later 'migrate up' without it creates the inbox.

'migrate up --fleet' creates or upgrades the fleet's control tables in --dsn, then the
millbox tables of every tenant of its catalog, --parallel at once, and prints a line per
tenant as it finishes (ok, with what it did, or error, with why), then a count. With
--tenants FILE it migrates the tenants of the file instead and does not touch the
control database: one tenant a line, ID SERVER [DATABASE [SCHEMA]] separated by blanks,
- for none, # for a comment. --json prints one object (tenants, ok, failed) at the end.
The exit status is 1 when any tenant failed. 'migrate sql --fleet' prints the control
tables' SQL.

Fleets (package forwarder/fleet): with --fleet, --dsn names the fleet's control database,
whose catalog lists the tenants; --fleet-schema (a Postgres schema or MySQL database) and
--fleet-prefix name its tables as postgres.FleetOptions (or mysql's, sqlite's) do. The
catalog names each tenant's server, never a connection string: give every server's DSN
with --server name=DSN, once per server, or in $MILLBOX_FLEET_SERVERS, one name=DSN a
line (# starts a comment; --server wins for a name given in both). Keep passwords there,
off the command line. A tenant's database replaces the database of its server's DSN
(PostgreSQL, SQLite), or names the database of its tables (MySQL); its schema holds its
tables. --outbox-table and --inbox-table apply to every tenant; --schema does not apply
(each tenant's comes from the catalog). --parallel N (default 8) bounds the tenants
visited at once; tenants of one database share a pool of at most 4 connections.

Examples:
  millbox migrate up --dsn 'postgres://app@localhost:5432/app' --schema messaging
  millbox migrate up --dsn 'sqlite:///var/lib/app/app.db'
  millbox migrate sql --db postgres --schema messaging > migrations/0001_millbox.sql
  millbox migrate sql --db mysql --outbox-table events_outbox
  millbox migrate up --dsn 'postgres://app@localhost:5432/app' --partitioned --interval 24h
  millbox migrate sql --db postgres --without-inbox
  millbox migrate up --fleet --dsn 'postgres://app@control/app' --server pg1='postgres://app@db1/postgres' --parallel 16
  MILLBOX_FLEET_SERVERS="$(cat servers)" millbox migrate up --fleet --tenants tenants.txt
`

const statusUsage = `Usage:
  millbox status [--json] [flags]

Shows, per topic, the pending rows (rows waiting for a retry included), how many of
them are retrying, the age of the oldest pending row, the scheduled messages (delayed,
waiting for their due time), the dead letters and the forwarded rows kept for audit,
and when the next scheduled message is due; then inbox records per consumer, and which
forwarder instance holds which partitions. Ages are measured by the database's clock; a requeued
dead letter waits from its requeue (its created time stays the message's).

--json prints one object with the fields pending, retrying, oldest_pending_age_seconds,
scheduled, next_due (when any is scheduled), dead_letters, held_keys, forwarded_kept, inbox_records, oldest_inbox_age_seconds, topics,
consumers, partitions and owners.

With --fleet it reports every tenant of a forwarder fleet instead, from the control
database of --dsn: per tenant the live instance holding it (- while none does), its
server, database and schema, and from its own outbox the pending rows, the age of the
oldest, the scheduled messages and the dead letters; the largest backlog first, then
the oldest pending message, then the tenants that are down; a line of totals, and the
live instances with the number of tenants each holds. Each tenant's outbox is read
with one cheap statement, --parallel at once, within twice --connect-timeout. A tenant
that cannot be read (its server unreachable or not given, its tables missing) is shown
as down, with the error below the table; the command still succeeds. --json prints one
object with instances, tenants (id, server, database, schema, instance, removed, down,
error, pending, oldest_pending_age_seconds, scheduled, next_due, dead_letters,
held_keys) and totals (tenants, instances, unowned, down, pending, dead_letters,
oldest_pending_age_seconds).

Fleets (package forwarder/fleet): with --fleet, --dsn names the fleet's control database,
whose catalog lists the tenants; --fleet-schema (a Postgres schema or MySQL database) and
--fleet-prefix name its tables as postgres.FleetOptions (or mysql's, sqlite's) do. The
catalog names each tenant's server, never a connection string: give every server's DSN
with --server name=DSN, once per server, or in $MILLBOX_FLEET_SERVERS, one name=DSN a
line (# starts a comment; --server wins for a name given in both). Keep passwords there,
off the command line. A tenant's database replaces the database of its server's DSN
(PostgreSQL, SQLite), or names the database of its tables (MySQL); its schema holds its
tables. --outbox-table and --inbox-table apply to every tenant; --schema does not apply
(each tenant's comes from the catalog). --parallel N (default 8) bounds the tenants
visited at once; tenants of one database share a pool of at most 4 connections.

Examples:
  millbox status
  millbox status --json | jq '.topics[] | select(.pending > 1000)'
  export MILLBOX_FLEET_SERVERS='pg1=postgres://app@db1:5432/postgres
pg2=postgres://app@db2:5432/postgres'
  millbox status --fleet --dsn 'postgres://app@control:5432/app' --fleet-schema fleet
  millbox status --fleet --json | jq '.tenants[] | select(.down)'
`

const deadUsage = `Usage:
  millbox dead list    [filters] [--group-by-error] [--limit N] [--after ID] [--json]
  millbox dead show    ID [--json]
  millbox dead held    [--limit N] [--json]
  millbox dead requeue {ID... | filters | --all} [--dry-run] [--yes] [--batch N]
  millbox dead discard {ID... | filters | --all} [--dry-run] [--yes] [--batch N]

A dead letter is a message that failed more often than the forwarder's MaxAttempts.
It leaves the outbox for the dead letters' table (the outbox's name with _dead) with its last error,
under its id, and stays there until it is requeued or discarded.

Filters (all must match):
  --topic T          exact topic
  --key K            exact ordering key
  --error TEXT       the last error contains TEXT (case-sensitive)
  --older-than D     died longer ago than D (30s, 15m, 36h, 7d, 1d12h)
  --newer-than D     died within the last D
  ID...              these ids (requeue, discard)
  --all              every dead letter (requeue, discard; alone: no ids or filters)

held lists the ordering keys a dead letter holds (forwarders with
DeadLetterHoldsKey): their later messages wait in the outbox, counted in HELD. Requeue
the dead letter to send it and then them, in order; discard it to let them go on.

requeue moves the rows back into the outbox, pending with zero attempts; the forwarder
sends them as soon as it reads them. requeue and discard act on the ids you name, the
dead letters a filter selects, or with --all every dead letter: without any of them they
refuse. Requeue of the ids you name runs at once; requeue by a filter or --all needs
--yes. discard deletes rows for good and always needs --yes. --dry-run counts what
would change and changes nothing.

Examples:
  millbox dead list --group-by-error
  millbox dead list --error 'no such host' --limit 20
  millbox dead show 1234
  millbox dead held
  millbox dead requeue 1234
  millbox dead requeue --topic orders --newer-than 2h --dry-run
  millbox dead requeue --topic orders --newer-than 2h --yes
  millbox dead discard --older-than 30d --yes
`

const pruneUsage = `Usage:
  millbox prune [--forwarded-older-than D] [--inbox-older-than D] [--batch N] [--dry-run]

Deletes forwarded rows kept for audit (forwarder Config.KeepForwarded, in the table named
after the outbox with _kept) published longer ago than --forwarded-older-than, and inbox records received longer ago than
--inbox-older-than, in batches of --batch rows, each its own short statement. Progress
goes to stderr. It never touches pending or dead rows, so it is safe while forwarders
and consumers run.

Keep inbox records longer than any redelivery of a message can take: a message
redelivered after its record is gone runs its handler again.

Examples:
  millbox prune --forwarded-older-than 7d --inbox-older-than 30d
  millbox prune --inbox-older-than 14d --batch 5000
  millbox prune --forwarded-older-than 1d --dry-run
`

func help(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(e.stdout, mainUsage)
		return nil
	}
	switch args[0] {
	case "migrate":
		return migrateCmd(ctx, e, []string{"--help"})
	case "status":
		return statusCmd(ctx, e, []string{"--help"})
	case "dead":
		return deadCmd(ctx, e, []string{"--help"})
	case "prune":
		return pruneCmd(ctx, e, []string{"--help"})
	case "partitions":
		return partitionsCmd(ctx, e, []string{"--help"})
	case "version":
		fmt.Fprintln(e.stdout, "Usage:\n  millbox version\n\nPrints the module version millbox was built from.")
		return nil
	}
	return usagef("unknown command %q; run 'millbox help'", args[0])
}
