// Command millbox operates a millbox installation from a terminal: it
// creates the tables, shows the backlog, finds, explains, requeues and
// discards dead letters, and prunes forwarded rows and old inbox records,
// on PostgreSQL, MySQL/MariaDB and SQLite.
//
// From a clone of the repository, run it or build it:
//
//	go run ./sqladapters/cmd/millbox help
//	go build -o bin/millbox ./sqladapters/cmd/millbox
//
// For a released version, install it, run it from any module, or pin it
// as a tool of your module:
//
//	go install github.com/millbox/millbox/sqladapters/cmd/millbox@latest
//	go run github.com/millbox/millbox/sqladapters/cmd/millbox@latest help
//	go get -tool github.com/millbox/millbox/sqladapters/cmd/millbox@latest   # then: go tool millbox status
//
// The database is chosen by the form of --dsn (or MILLBOX_DSN):
// postgres:// or a libpq keyword=value list, mysql:// or a
// go-sql-driver/mysql DSN, sqlite://path.
//
//	export MILLBOX_DSN='postgres://app@db:5432/app?sslmode=disable'
//	millbox migrate up                          # idempotent, safe from many processes
//	millbox status                              # pending per topic, oldest age, dead letters, partition owners
//	millbox status --json | jq .pending
//	millbox dead list --group-by-error
//	millbox dead show 1234
//	millbox dead held                           # keys held by dead letters, messages waiting behind each
//	millbox dead requeue --error 'connection refused' --dry-run
//	millbox dead requeue --error 'connection refused' --yes
//	millbox prune --forwarded-older-than 7d --inbox-older-than 30d
//	millbox migrate up --partitioned            # PostgreSQL: the time-partitioned outbox
//	millbox partitions list                     # its partitions, rows and what blocks a drop
//
// # Fleets
//
// With --fleet, status and migrate up act on every tenant of a forwarder
// fleet (package forwarder/fleet): --dsn names the fleet's control
// database, --fleet-schema and --fleet-prefix its tables, and the tenants
// come from its catalog. The catalog names each tenant's server, never a
// connection string, so the command needs every server's DSN: a
// --server name=DSN flag per server, or $MILLBOX_FLEET_SERVERS with one
// name=DSN a line (which keeps passwords off the command line; a --server
// flag wins for a name given in both). A tenant's database replaces the
// database of its server's DSN, and its schema holds its tables.
//
//	export MILLBOX_FLEET_SERVERS='pg1=postgres://app@db1:5432/postgres
//	pg2=postgres://app@db2:5432/postgres'
//	millbox status --fleet --dsn 'postgres://app@control:5432/app'
//	millbox migrate up --fleet --dsn 'postgres://app@control:5432/app' --parallel 16
//	millbox migrate up --fleet --tenants tenants.txt   # ID SERVER [DATABASE [SCHEMA]] a line; no control database
//
// status --fleet lists every tenant with the live instance that holds it
// and, read from its own outbox, its pending rows, the age of the oldest,
// its scheduled messages and dead letters: the largest backlog first,
// then the oldest pending message, with totals and the tenants each live
// instance holds (--json for scripts). A tenant that cannot be read (its
// server unreachable or not given, its tables missing) is listed as down
// with the error, and the command still succeeds. migrate up --fleet
// creates or upgrades the control tables, then every tenant's tables, and
// prints a line per tenant (ok or error); it exits with status 1 when any
// tenant failed. Both visit at most --parallel tenants at once (8 by
// default), tenants of one database sharing its connections.
//
// For teams that run schema changes with their own tool, `millbox migrate
// sql --db postgres` prints the complete SQL (CREATE SCHEMA included)
// without connecting.
//
// Errors name the schema (or MySQL database, or SQLite file) the command
// looked in, and every hint it prints (the next command to run) repeats
// the connection flags given (--dsn, --schema, --outbox-table,
// --inbox-table, --connect-timeout), so that pasted as shown it works on
// the same tables.
//
// # Changes are safe next to running forwarders
//
// dead requeue and dead discard act on the ids named, the dead letters a
// filter selects, or every dead letter with --all, and refuse to run with
// none of these (exit status 2), so that an empty filter never changes
// every dead letter. dead requeue with a filter or --all and dead discard
// are refused without --yes (exit status 2); --dry-run counts what they,
// and prune, would change.
// Requeue only makes dead rows pending again (a requeued row's age counts
// from its requeue; one that held its key goes before the key's waiting
// messages); prune works in bounded batches and never touches
// pending or dead rows. The same operations are a Go API in package
// sqladapters/ops, and a page to mount in an application in
// sqladapters/admin.
//
// # Security
//
// The DSN is read by the drivers' own parsers (pgx for PostgreSQL URLs and
// every libpq keyword=value list, go-sql-driver/mysql for MySQL) and never
// printed with its password: hints show it masked, and errors never repeat
// it. Prefer MILLBOX_DSN (or a libpq passfile or service) to a password on
// the command line, where other users of the machine may see it. Topics,
// keys, errors and payloads come from whoever published or failed the
// messages: text output shows their control characters as escapes (\x1b,
// \u202e), so that a dead letter cannot drive the terminal; --json output
// escapes them as JSON does. The command can requeue and discard: give the
// role of its DSN to operators only.
//
// Run `millbox help` for every command and flag. Exit status: 0 on
// success, 1 when an operation failed, 2 for a usage error or a change
// refused without --yes.
package main
