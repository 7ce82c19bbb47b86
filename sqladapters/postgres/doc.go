// Package postgres is the PostgreSQL dialect of millbox: the outbox, lease
// and inbox tables, their migrations, and every statement the publisher,
// forwarder and inbox run, which it executes on the DB or transaction it is
// given (the store contract, sqladapters.Dialect). It imports no driver;
// pair it with sqladapters/pgxv5 or sqladapters/stdsql (pgx stdlib or
// lib/pq).
//
//	dialect, err := postgres.New(postgres.Options{Schema: "app"})
//	err = sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), dialect)
//
// It needs PostgreSQL 13 or later (the outbox insert and the forwarder use
// pg_current_xact_id and pg_current_snapshot). Migrations run in the
// caller's transaction too (sqladapters.MigrateTx); concurrent migrators
// serialize on an advisory lock. Schema and table names are plain
// identifiers, quoted; anything else is refused with
// sqladapters.ErrInvalidName.
//
// What PostgreSQL has that the other databases lack: notifications
// (Options.Notify), the time-partitioned outbox (Options.Partitioned),
// reads that start past the rows already forwarded
// (sqladapters.Features.Horizon) and change data capture (forwarder/cdc).
//
// # Finding new rows, and Notify
//
// Forwarders find new rows by watching the outbox's id sequence every few
// milliseconds (HighWaterMark; forwarder.Polling.WatchInterval). With
// Options.Notify the outbox insert also calls pg_notify, so forwarders
// listening through pgxv5.WrapPool wake up as soon as the writing
// transaction commits. It is off by default: NOTIFY takes a database-wide
// lock at commit that serializes every committing transaction that
// notified, which costs far more under concurrent writers than the
// milliseconds it saves: with 8 writers, a business transaction with the
// outbox write took more than twice as long as without it, against about
// a third longer without Notify. The benchmark program's write case
// measures both (integration/bench in the repository).
//
// The outbox holds only rows that still have to go: an insert maintains
// its primary key alone (the retry index is partial and holds only rows
// that failed), and the forwarder reads pending rows through the primary
// key. Dead letters and forwarded rows kept for audit move, in one
// statement each, to the tables <outbox>_dead and <outbox>_kept, under
// their ids; a requeue moves a dead letter back. Migration 5 moved the
// rows of earlier installations there. Delayed messages wait in
// <outbox>_scheduled (migration 7), indexed by due time, and move into the
// outbox when due in one statement (DELETE ... RETURNING feeding the
// INSERT), so scheduled messages never lengthen the pending read; on a
// partitioned outbox they land in the current partition. Concurrent moves
// (one per forwarder instance) take turns on a transaction-scoped advisory
// lock named after the outbox, so a key's delayed messages reach the
// outbox, and the destination, in due order.
//
// # Statistics for a fleet
//
// A fleet of forwarders serving many tenant databases (forwarder/fleet)
// learns that a tenant wrote from the database's insert counter,
// pg_stat_database.tup_inserted, rather than by keeping a connection to
// every tenant. A session reports its statistics when it goes idle, but
// at most once a second: a transaction that commits less than a second
// after the session's previous report, and is followed by no other for
// 10 s, is counted 10 s late (PGSTAT_IDLE_INTERVAL; up to 60 s under lock
// contention), and the fleet forwards its messages that late.
// Options.FlushStats closes that hole: the insert calls
// pg_stat_force_next_flush() (PostgreSQL 15 and later, callable by any
// role), so the session reports at the end of the transaction, before
// the commit returns. Each publishing transaction then pays a
// synchronous write of its statistics into shared memory: with 8
// concurrent writers each committing a business row and an outbox row, a
// 2-core machine committed 7–21 % fewer transactions per second. Leave it
// off unless a fleet's stat doorbell watches the database.
//
// # Behind PgBouncer
//
// Every statement runs in a transaction of its own or of the caller's,
// and no session state is kept: locks are transaction-scoped
// (pg_advisory_xact_lock), settings are SET LOCAL. So the publisher, the
// forwarder and the inbox work behind PgBouncer in transaction pooling,
// with two things to know.
//
// The connection string. PgBouncer before 1.21 does not keep prepared
// statements across transactions, and pgx caches them per connection by
// default: statements then fail with `prepared statement "stmtcache_..."
// does not exist` (SQLSTATE 26000) or `... already exists` (42P05), and
// millbox adds a hint to either error. Tell pgx not to keep any:
//
//	postgres://app@pgbouncer:6432/app?default_query_exec_mode=exec
//
// (simple_protocol works too; exec keeps binary parameters). The same
// parameter applies to database/sql with pgx stdlib; lib/pq needs nothing
// but sends extra_float_digits, so list it in PgBouncer's
// ignore_startup_parameters. PgBouncer 1.21 and later with
// max_prepared_statements set can keep pgx's default.
//
// Notifications. Without Options.Notify there is nothing else to do: the
// forwarder watches the id sequence through its pool, which works through
// PgBouncer. LISTEN subscribes the server session that runs it, which in a
// transaction pool goes back to the pool when the statement ends: the
// listener would hear nothing, and the server connection would stay
// subscribed for unrelated clients. Give the listener a direct connection
// (or one through a session-pooled database) and keep the pool on
// PgBouncer:
//
//	db := pgxv5.WrapPool(pool, pgxv5.ListenOn("postgres://app@postgres:5432/app"))
//
// The listener's connection is used for LISTEN only, one per forwarder
// instance, opened per subscription and closed when it ends. A forwarder
// checks at start and every forwarder.Polling.NotifyProbeInterval that a
// notification it sends through Config.DB comes back; when none does
// within two seconds (or pgxv5 sees the listener's statements answered by
// different server processes, pgxv5.ErrPooledListener), it logs an error
// (once, then every five minutes), reports forwarder.ErrNotificationsLost
// to Hooks.OnError and in Status, watches the id sequence meanwhile, so
// new rows still go out within milliseconds, unsubscribes the server
// session it subscribed, and listens again with a backoff. The producers'
// pg_notify works through transaction pooling as it is.
//
// The integration tests run a producer and a forwarder through PgBouncer
// 1.18 in transaction pooling (MILLBOX_PGBOUNCER_URL): the default mode
// delivers every message in per-key order, a listener on the pool is
// reported while every message still arrives, a ListenOn listener reports
// nothing, and afterwards no server connection listens.
//
// # Failover
//
// A primary that dies and a standby promoted in its place lose nothing
// that committed, with two settings of the user's.
//
// Synchronous replication. With synchronous_standby_names set on the
// primary (for example 'ANY 1 (standby1, standby2)') and synchronous_commit
// on (the default) or remote_apply, a commit returns only once a standby
// has flushed it: every message, and every inbox record, that the
// application saw commit is on the standby that takes over. With
// asynchronous replication the last commits the application saw may be
// missing on the promoted standby, and no outbox can bring them back.
//
// A connection string that finds the primary. Give every pool, the
// application's, the forwarder's and the change-data-capture reader's
// (cdc.Source.ConnString), every server and ask for the one that accepts
// writes; pgx (sqladapters/pgxv5, and database/sql with pgx's stdlib)
// reads both forms:
//
//	postgres://app@db1:5432,db2:5432/app?target_session_attrs=read-write&connect_timeout=5
//	host=db1,db2 port=5432,5432 dbname=app user=app target_session_attrs=read-write connect_timeout=5
//
// A new connection tries the servers in order and keeps the first that
// accepts writes; connect_timeout bounds the wait for one that does not
// answer. A name the failover manager moves (DNS, a virtual IP, a proxy)
// works too: keep target_session_attrs=read-write there as well, so that a
// connection that still reaches the old server, demoted, is refused. pgx
// checks it only when it opens a connection: a pool keeps its connections
// to a primary that died or became read-only. pgxv5.WrapPool and
// stdsql.WrapDB therefore drop the connections that fail with a server
// that went away or that refused a write as read-only (SQLSTATE 25006),
// and the next statements connect afresh (pgxv5.DropsConnection,
// stdsql.DropsConnection; begin the application's transactions through
// the same DB, or reset its pool on those errors).
//
// What each part keeps, without a restart:
//
//   - The outbox publisher: a transaction that committed on the old
//     primary is on the new one with its messages. One whose COMMIT
//     failed with the connection may or may not have committed. Change
//     data capture may even deliver its messages when the new primary
//     does not have them: logical decoding streams a commit once the old
//     primary flushed it, before the standby confirmed it (other sessions,
//     and so the polling source, see it only after).
//   - Polling (forwarder.Polling): at least once, each key in order. Reads,
//     lease renewals and deletes that fail are retried; once a pool
//     reaches the new primary the forwarder resumes where the outbox
//     stands there: rows it published whose delete was lost are published
//     again. Leases are rows of the outbox's tables and came over with
//     them: the instance renews its own, and a partition of an instance
//     that died moves after forwarder.Polling.LeaseTTL.
//   - Change data capture with the outbox table (forwarder/cdc): at least
//     once, each key in order. Before PostgreSQL 17 the promoted standby
//     has no replication slot; with cdc.Source.CreateIfMissing the
//     forwarder creates it there and reads every row the lost slot had
//     not confirmed from the table, and reports the lost slot
//     (cdc.SlotLostError).
//   - The outbox without a table (forwarder.PublisherConfig.WithoutTable):
//     messages committed after the lost slot's confirmed position were
//     only in the WAL and are lost; the forwarder reports the stretch of
//     WAL. Publishers never commit a message no slot could read: while the
//     promoted standby has no slot, they write into the table. PostgreSQL
//     17's failover slots keep the slot across a promotion; forwarder/cdc
//     ("Failover") lists the settings.
//   - The inbox (package middleware): a handler's transaction that
//     committed on the old primary is on the new one with its inbox
//     record, so the message the broker redelivers (its ack was lost with
//     the failover) is recognized and the handler does not run again.
//
// A switchover (the old primary stopped cleanly, the standby promoted once
// it replayed everything) is a failover without the uncertain commits.
//
// The integration tests run a primary and a synchronous standby of their
// own (PostgreSQL's server binaries: MILLBOX_PG_BIN, else Debian's
// /usr/lib/postgresql/<version>/bin): they kill the primary with SIGKILL,
// or stop it cleanly, while publishers commit through a multi-host URL,
// promote the standby, and check that every message the application saw
// commit arrives, in each key's order, from a forwarder that never
// restarted (polling on pgx and database/sql, change data capture, the
// outbox without a table), with a primary fenced read-only too, and the
// inbox across a failover. The benchmark program's failover case measures
// the time from the promotion to the first delivery from the new primary.
//
// # Autovacuum
//
// The outbox is a queue: rows are inserted, read once and deleted. The
// migration sets, on the outbox table (and on each partition of the
// partitioned layout), autovacuum_vacuum_scale_factor and
// autovacuum_vacuum_insert_scale_factor to 0.01: vacuum once 1 % of the
// rows are dead or newly inserted, instead of the default 20 %. On the
// server:
//
//   - Keep autovacuum and track_counts on (the defaults). Without them
//     nothing is vacuumed, and reads of a backlog slow down without end.
//   - autovacuum_naptime (default 1 min) bounds how long deleted rows pile
//     up at the head of the primary key; a forwarder draining 50,000
//     messages per second leaves 3 million in a minute, and its read from
//     the head (one per PollInterval) walks them. Lower it to 10–15 s on a
//     busy outbox.
//   - Vacuuming a large outbox reads its indexes in full each time; throttled, it can take minutes while dead rows pile up. Turn
//     the throttle off for the outbox alone: ALTER TABLE millbox_outbox
//     SET (autovacuum_vacuum_cost_delay = 0) (on each partition of the
//     partitioned layout).
//   - autovacuum_work_mem (or maintenance_work_mem, default 64 MB) holds
//     about 11 million dead rows per index pass; more make vacuum scan the
//     indexes twice.
//   - Long-running transactions, idle-in-transaction sessions, and
//     replication slots or standbys with hot_standby_feedback hold back
//     the horizon below which rows count as dead: until they end, vacuum
//     cannot remove the outbox's deleted rows. A transaction that wrote
//     something and stays open also keeps the forwarder's floor (below)
//     from passing the rows inserted since it began. Set
//     idle_in_transaction_session_timeout and watch
//     pg_stat_activity.backend_xmin.
//
// The inbox table keeps PostgreSQL's default thresholds: the cleaner's
// speed does not depend on vacuum, and a cleaning round that deletes more
// than 20 % of the table sets off autovacuum by itself.
//
// # Large tables
//
// A read of the forwarder is an index scan of the primary key that stops
// after BatchSize rows, custom or generic plan alike, however many rows
// wait. What a read from the first row grows with is the number of rows
// deleted since the last vacuum: their index entries stay until vacuum
// removes them. The forwarder therefore reads past the rows already
// forwarded: once per PollInterval it reads from the first row and sets a
// floor from the id sequence and the oldest running transaction
// (Dialect.PendingHorizon); the reads in between start after it. Package
// forwarder ("Reading a large outbox") tells when the floor applies. With
// an id sequence that hands out blocks of ids (CACHE above 1) or a role
// that may not read the sequence, the forwarder logs why once and reads
// from the first row. The floor starts over when the sequence goes back (a
// restart, the table made again) or transaction ids do (another server
// after a failover).
//
// The inbox cleaner deletes in batches of CleanerConfig.BatchSize, each
// starting where the previous one ended (Dialect.DeleteInbox), so a batch
// costs the same late in a cleaning of millions of rows as at its start.
//
// Where forwarded rows are kept (forwarder.Config.KeepForwarded) or the
// outbox may hold tens of millions of rows after an outage, the
// time-partitioned layout removes old rows by dropping partitions instead
// of deletes and vacuum: see PartitionOptions, MaintainPartitions and
// `millbox partitions`.
//
// The integration/bench program of the repository measures all of this
// (its backlog and inbox-clean cases); its README holds the results.
//
// # Fleet control tables
//
// NewFleet returns the control tables of a forwarder fleet
// (sqladapters.FleetStore): <prefix>_members, _tenants, _version and
// _migrations, in any schema of a database the application runs. Claims
// pick tenants with FOR UPDATE SKIP LOCKED and take them in a second
// statement, which sees every commit made before the picked rows were
// locked; a claim first deletes the expired member rows, waiting for a
// renewal of one under way. At steady state an instance runs one UPDATE
// of its member row per renewal, and reads the live members and the
// catalog version, one row each.
package postgres
