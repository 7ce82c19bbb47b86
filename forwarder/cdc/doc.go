// Package cdc is the change-data-capture mode of the outbox forwarder on
// PostgreSQL: instead of polling the outbox table, it streams the table's
// inserts from a publication through a logical replication slot (plugin
// pgoutput) and publishes them to any Watermill message.Publisher, as the
// same messages the polling forwarder sends (UUID, payload, metadata with
// the ordering key). Batch publishers (forwarder/kafkabatch,
// forwarder/amqpbatch) report partial deliveries with
// forwarder.PartialError, as for the polling forwarder.
//
// # Setup
//
// The server needs wal_level = logical (ALTER SYSTEM SET wal_level =
// logical, then a restart) and free max_replication_slots and
// max_wal_senders; the role of Config.ConnString needs REPLICATION (ALTER
// ROLE name REPLICATION). Setup creates the publication (inserts and
// updates of the outbox table) and the slot; Drop removes them;
// Config.CreateIfMissing makes Run create them. Run reports a missing
// setting, privilege, table, publication or slot at once, saying what to
// change. A slot retains WAL from its confirmed position on: drop the slots
// of outboxes no forwarder reads any more. MetricSlotLag and MetricSlotAge
// report how far behind the slot is.
//
// # Guarantees
//
//   - At least once, in commit order. The slot's confirmed position moves
//     past a transaction only once every row of it, and of every earlier
//     transaction, is done: acknowledged by the destination (Publish
//     returned nil, or a forwarder.PartialError counted it), or left in
//     the table to the polling path below after its failure was recorded
//     or while its key is handed to polling. A restarted or new active
//     reader resumes from there; rows after it may be published again.
//     Published rows are then deleted in the background; a row whose
//     delete is lost in a crash is still pending at the next start and is
//     published again (a duplicate, never a loss).
//   - Per-key order. A key's rows are published by one call at a time, in
//     the order their transactions committed; while a key is handed to
//     polling, in id order, as the polling forwarder does. Keys are
//     independent; Concurrency bounds the calls in flight.
//   - Failures hold back only their key. A failed row is recorded with the
//     dialect's RecordFailure (attempts, last error, next attempt with
//     exponential backoff, dead letter after MaxAttempts) and its key is
//     handed to polling: the key's later rows stay in the table and a
//     polling path publishes the key's pending rows in id order, honouring
//     the backoff, passing over dead letters. A key goes back to the stream
//     when a read of the table finds no pending row of it, nothing of it is
//     in flight, every row the stream left to polling for it was visible to
//     that read (its transaction ended before the read's snapshot), and the
//     stream has passed the WAL position taken in that read: no row of the
//     key committed before the read can then still come from the stream,
//     so none is skipped and none published twice. When the destination
//     itself is unavailable (forwarder.ErrDestinationUnavailable, a
//     connection error) the rows are retried without counting attempts.
//   - Backlogs and restarts. When a reader becomes active, every key with a
//     pending row in the table starts handed to polling. Rows of the stream
//     that a previous reader already published (committed before that read
//     and no longer pending) are not published again.
//   - Requeued dead letters. forwarder.RequeueDeadLetters makes rows
//     pending again with an UPDATE; the stream sees it and hands the row's
//     key to polling, which publishes it.
//   - One active reader. Instances take a session advisory lock on their
//     replication connection; the others stand by and try again every
//     StandbyRetry. When the active process dies, its connection closes,
//     the lock goes with it, and a standby starts streaming within seconds,
//     retrying START_REPLICATION while the server still marks the slot
//     active.
//   - Table hygiene. Published rows are deleted in batches of at most
//     DeleteBatch, or stamped published_at with KeepForwarded.
//
// A Publish call that has not returned within PublishTimeout counts as a
// failed attempt of its first row; its key is handed to polling and stays
// held until the call returns, so a late success only produces a
// duplicate. Close waits for calls in flight up to PublishTimeout and for
// the deletes of published rows up to CloseTimeout; it does not wait for
// calls that already passed PublishTimeout.
//
// PostgreSQL waits, when it shuts down, until its replication clients have
// confirmed everything it sent. The forwarder confirms as soon as rows are
// acknowledged, and ends its session when the server reports that it is
// shutting down (SQLSTATE 57P01, 57P03), so a restart is not held up; the
// next session resumes from the slot.
//
// Logical decoding reads the WAL of the whole cluster, not only the outbox:
// the delay from commit to the stream grows with the cluster's total WAL
// volume and with large transactions committed just before (their changes
// are decoded in full at their commit).
//
// Run checks the database and then returns nothing until it stops; Ready
// returns once those checks passed, whether this instance then leads or
// stands by (Active tells). A reader that lost its connection while a call was in flight may
// overlap for the length of that call with the next active reader, which
// can publish the call's rows again (duplicates, as with the polling
// forwarder's lease expiry).
//
// The polling forwarder (package forwarder) works on every database and
// needs no server settings; choose this mode on PostgreSQL for lower
// commit-to-publish latency without polling load, at the price of a
// replication slot to operate.
package cdc
