// Package cdc is the change-data-capture source of the forwarder on
// PostgreSQL: set a Source as forwarder.Config.Source and the forwarder,
// instead of polling the outbox table, streams the table's inserts from a
// publication through a logical replication slot (plugin pgoutput), and
// the messages of publishers without a table (see below). It is
// the same forwarder: the same lanes, breaker, retries, dead letters,
// metrics, health and lifecycle as with forwarder.Polling, and the same
// messages reach the destination.
//
//	fw, err := forwarder.New(forwarder.Config{
//		DB:          pgxv5.WrapPool(pool),
//		Dialect:     dialect,
//		Destination: kafkaPublisher,
//		Source:      cdc.Source{ConnString: url, CreateIfMissing: true},
//	})
//
// # When to choose it
//
// Polling works on every database and needs no server settings; it finds
// new rows within milliseconds by watching the outbox's id sequence. This
// source gives a lower and steadier commit-to-publish latency under load
// and reads nothing while the outbox is idle, at the price of a
// replication slot to operate. Logical decoding reads the WAL of the whole
// cluster: the delay from commit to the stream grows with the cluster's
// total WAL volume and with large transactions committed just before (they
// are decoded in full at their commit).
//
// # Setup
//
// The server needs wal_level = logical (ALTER SYSTEM SET wal_level =
// logical, then a restart) and free max_replication_slots and
// max_wal_senders; the role of Source.ConnString needs REPLICATION (ALTER
// ROLE name REPLICATION). Setup creates the publication (inserts into
// the outbox table) and the slot; Drop removes them;
// Source.CreateIfMissing makes Run create them, also when the slot is
// found gone later. Run reports a missing setting, privilege, table,
// publication or slot at once, saying what to change, and Ready returns
// the same error. Slot and publication names
// are plain lower-case identifiers; anything else is refused. The outbox
// table, the outbox Publisher, dead letters and their requeue are the same
// as with polling: an application switches sources by changing
// forwarder.Config.Source alone. So are dead letters that hold their keys
// (forwarder.Config.DeadLetterHoldsKey): a held key is handed to polling
// (below) and stays there while its dead letter holds it, its rows after
// the dead letter left in the table; the read of the handed keys finds
// its requeue or discard.
//
// # Guarantees
//
//   - At least once, in commit order. The slot's confirmed position moves
//     past a transaction only once every row of it, and of every earlier
//     transaction, is done: acknowledged by the destination, or left in the
//     table to the polling path below. A restarted or new active reader
//     resumes from there; rows after it may be published again. Published
//     rows are then deleted; a row whose delete is lost in a crash is still
//     pending at the next start and is published again (a duplicate, never
//     a loss).
//   - Per-key order. A key's rows are published one call at a time, in the
//     order their transactions committed; while its key is handed to
//     polling, in id order.
//   - Failures hold back only their key. A failed row is recorded by the
//     forwarder (attempts, last error, backoff, dead letter after
//     MaxAttempts) and its key is handed to polling: the key's later rows
//     stay in the table and a read of the handed keys publishes them in id
//     order, honouring the backoff, passing over dead letters (stopping at
//     one that holds its key, with forwarder.Config.DeadLetterHoldsKey:
//     the key stays handed until it is requeued or discarded). A key goes
//     back to the stream when a read of the table finds no pending row of
//     it, the forwarder holds nothing of it, every row the stream left to
//     polling for it was visible to that read, and the stream has passed
//     the WAL position taken in that read: none is skipped and none
//     published twice. Where publishers without a table write, a read of
//     the handed keys waits, before it publishes, for the stream to pass
//     its position, so that a key's messages without a table committed
//     before it go first; it knows whether one may have from the count of
//     calls without a table (migration 9), which each such call draws a
//     number from and the stream brings: a read that saw no number the
//     stream has not brought waits for nothing, so where every publisher
//     writes into the table no read waits, with no setting to choose.
//     Upgrade the publishers without a table before the forwarders: a
//     publisher of an earlier version draws no number.
//   - Backlogs and restarts. When a reader becomes active, every key with a
//     pending row in the table, or held by a dead letter, starts handed to
//     polling (rows written before the slot existed, rows a previous
//     reader left). Rows of the stream that a previous reader already
//     published are not published again.
//   - Requeued dead letters. A requeue (sqladapters/ops) moves dead letters
//     back into the outbox under their ids, with requeued_at set; the
//     stream sees the insert and hands the row's key to polling, which
//     publishes it ahead of the key's later rows.
//   - Exactly once. With forwarder.Config.ExactlyOnce the outbox is one
//     partition of transactions: a reader that becomes active claims it at
//     the destination (fencing the previous reader) and removes the rows
//     the last committed transaction published before its session reads
//     the table; rows the stream replays from before that read go through
//     the table and are published only if still pending. No row is then
//     published twice, across crashes and a failover, nor by a reader that
//     lost its connection during a call: the next reader's claim fences
//     the call's transaction.
//   - One active reader. Instances take a session advisory lock on their
//     replication connection; the others stand by and try again every
//     StandbyRetry. When the active process dies, its connection closes,
//     the lock goes with it, and a standby starts streaming within seconds.
//     Forwarder.Partitions reports partition 0 while an instance is the
//     active reader.
//
// # The outbox without a table
//
// A publisher with forwarder.PublisherConfig.WithoutTable writes each
// Publish call's messages as one logical decoding message
// (pg_logical_emit_message) in the caller's transaction: it commits or
// rolls back with the transaction, and the stream delivers it in commit
// order, among the table's inserts, with pgoutput's messages option
// (PostgreSQL 14 or later; the source asks for it there). The messages
// take the same lanes, breaker and calls as rows of the table, and the
// slot's confirmed position moves past their transaction only once each
// is acknowledged or written into the table. Publishers with and without
// a table may share the outbox and the forwarder.
//
//   - Failures go to the table. A message whose delivery fails is written
//     into the outbox with its attempt (or into the dead letters), and its
//     key is handed to polling; the key's later messages still in the
//     forwarder, and those the stream brings while the key is handed, are
//     written after it, in the order the stream brought them. From there
//     the key's rows take the ordinary path in id order: retries with
//     backoff, the dead letter after MaxAttempts, requeue. The table sees
//     only failures.
//   - Per-key order. A key's messages and rows reach the destination in
//     commit order while it streams, and in id order while it is handed to
//     polling, as rows of the table do.
//   - At least once. A message is held only by the WAL until the slot
//     confirms its transaction. A crash before then delivers it again
//     (a duplicate) at the next start, and nothing tells a message the
//     destination acknowledged from one it never saw: every unconfirmed
//     message is delivered again. KeepForwarded writes delivered messages
//     into the kept rows, as it keeps rows of the table.
//
// Messages in WAL that a dropped, invalidated or lost slot no longer holds
// are lost: there is no row to fall back on. Dropping the slot (Drop)
// while publishers write without a table loses what it had not confirmed,
// and so does a slot invalidated because it retained more than
// max_slot_wal_keep_size, or a slot that stayed on a primary that died
// (see Failover). The guardrails: a publisher without a table refuses to
// write (sqladapters.ErrEmitUnavailable) before PostgreSQL 14 or without
// wal_level logical; where the database has no logical slot ready to
// decode at the moment of the call, it writes the call's messages into
// the outbox table instead (the statement that would write them into the
// WAL looks for the slot, in the caller's transaction, so that no message
// commits into a WAL no slot reads); Run refuses to start without
// wal_level logical, and warns when max_slot_wal_keep_size is unset (a
// slot left behind then fills the disk instead) and where the server has
// standbys but the slot would not survive a promotion. Set max_slot_wal_keep_size well above what the slot retains
// while a forwarder catches up after its longest outage, alert on
// MetricSlotLag (and MetricSlotAge) far below it, and never drop the slot
// of an outbox whose publishers write without a table before they stopped
// and the forwarder drained it. Publishers with a table lose nothing to an
// invalidated slot: the next reader finds their rows in the table.
//
// # Failover
//
// A primary that dies and a standby promoted in its place (Patroni,
// pg_auto_failover, a cloud service), or a planned switchover. Give the
// forwarder, the publishers' pool and Source.ConnString a multi-host
// connection string that asks for the server accepting writes, and run
// synchronous replication, as sqladapters/postgres ("Failover") says: a
// commit the application saw is then on the standby, and each pool finds
// the new primary by itself. What each kind of publisher keeps:
//
//   - Outbox table: nothing committed is lost, without a restart. Before
//     PostgreSQL 17 a slot lives on its server only, so the promoted
//     standby has none (the publication, a catalog row, is there). With
//     CreateIfMissing the forwarder creates the slot again as soon as it
//     reaches the new primary, at any time, not only at start, and its
//     new session reads every pending row from the table: the rows the
//     lost slot had not confirmed are pending there, since only a
//     published row is deleted. Rows may be published again (at least
//     once); each key's order holds. Without CreateIfMissing the reader
//     reports ErrNotSetUp, saying that the slot is gone, until it is
//     created (Setup).
//   - Without a table: the messages committed after the slot's last
//     confirmed position, up to the promotion, were only in the WAL, which
//     a slot created on the new primary cannot read: they are lost, as
//     many as the forwarder was behind when the primary died: none while
//     it keeps up (the benchmark's failover case counts them, as
//     failover_wal_only_lost). Everything committed after the promotion
//     is delivered:
//     while the forwarder's slot does not exist (PublisherConfig.Slot
//     names it), publishers write into the table, and once the forwarder
//     created it they write into the WAL again. That is
//     what the outbox without a table trades for its lower cost (no row,
//     index entry, delete or vacuum per message): on a failover without a
//     slot that survives it, what the forwarder had not delivered yet.
//     Where a failover must lose nothing, publish into the table.
//   - Either way the reader reports the lost slot, loudly: a
//     SlotLostError (errors.Is ErrSlotLost) logged as an error, passed to
//     forwarder.Hooks.OnError and kept as forwarder.Status's last error,
//     with the stretch of WAL the new slot cannot read (from the position
//     this forwarder had confirmed to where the new slot starts, and its
//     size) and the timelines before and after. It tells a slot lost from
//     one it left by the server's timeline (IDENTIFY_SYSTEM), which a
//     promotion moves on. A forwarder that restarted after the promotion
//     no longer knows the old position: it warns when it creates the slot
//     on a server whose timeline shows a promotion.
//   - A message whose commit the application did not see succeed (the
//     primary died during COMMIT) may or may not have committed, and may
//     be delivered even when the new primary does not have it: the old
//     primary decodes and streams a commit once it flushed it, before the
//     synchronous standby confirmed it (PostgreSQL 17's
//     synchronized_standby_slots, below, makes it wait).
//
// To keep the slot itself across a failover, PostgreSQL 17 and later
// synchronize failover slots to standbys. The forwarder creates its slot
// as a failover slot there (Setup and CreateIfMissing choose by the
// server's version; turn an existing slot into one with
// ALTER_REPLICATION_SLOT name (FAILOVER true) on a replication
// connection). The standbys need sync_replication_slots = on,
// hot_standby_feedback = on, a physical slot on the primary
// (primary_slot_name) and a dbname in primary_conninfo; the primary needs
// synchronized_standby_slots naming those physical slots, so that the
// forwarder is never sent changes a standby has not received. The
// promoted standby's copy of the slot may lag what the forwarder had
// confirmed: what follows its position is delivered again (duplicates,
// no loss), and the reader logs that the server was promoted and which
// positions it reads from. Without those settings, Run warns at start
// where the server streams to standbys. (The tests of this repository run
// PostgreSQL 15: the failover slot is documented, not yet tested here.)
//
// # Operating the slot
//
// A slot retains every WAL segment from its confirmed position on: drop
// the slots of outboxes no forwarder reads any more, and set
// max_slot_wal_keep_size so that a slot left behind cannot fill the disk
// (a slot that loses WAL it still needed is invalidated, and its rows are
// then found only in the table, by the next reader's start; messages of
// publishers without a table are lost, see above). MetricSlotLag and
// MetricSlotAge report how far behind the slot is; alert on them.
//
// PostgreSQL waits, when it shuts down, until its replication clients have
// confirmed everything it sent. The reader confirms as soon as rows are
// acknowledged, and ends its session when the server reports that it is
// shutting down (SQLSTATE 57P01, 57P03), so a restart is not held up; the
// next session resumes from the slot.
//
// A reader that lost its connection while a call was in flight may overlap
// for the length of that call with the next active reader, which can
// publish the call's rows again (duplicates, as with the polling source's
// lease expiry).
//
// # Tests and measurements
//
// The CDC tests of the integration module run the forwarder's conformance
// and fault suites on this source, and stream 50,000 messages from
// concurrent, out-of-order commits, kill the active reader with SIGKILL,
// and cover a poison key, a hanging call, a backlog at start, startup
// errors and the gauges. Their failover tests run a primary and a
// synchronous standby of their own, kill the primary with SIGKILL (or stop
// it, for a switchover) while publishers commit and the forwarder lags,
// promote the standby and count what the application saw commit against
// what arrived; the benchmark program's failover case (go run
// ./integration/bench -case failover) measures the same at length. The benchmark program's cdc case (go run
// ./integration/bench -case cdc) compares this source with polling, drain
// and latency in one run; its README holds the results. examples/cdc runs
// two instances, one streaming and one standing by, and takes the slot
// over half way.
//
// # Dependencies
//
// The package may import sqladapters, the source contract and the retry
// helper of the forwarder (forwarder/internal/source, internal/retry) and
// its own internal packages (internal/pgoutput, internal/writer); never the
// forwarder or the engine, which drive it through the source contract.
package cdc
