// Package inbox is millbox's inbox store: it records that a consumer has
// processed a message, inside the transaction that does the processing, so
// a redelivered message can be told from a new one. It also removes old
// records after a retention window.
//
// Most applications use it through the Watermill middleware in
// millbox/middleware, which begins the transaction and records the message
// (BeginRecord: one round trip with pgx), runs the handler and commits. Use
// Inbox directly when messages arrive some other way:
//
//	first, err := ib.Record(ctx, tx, "billing", msg.UUID)
//	if err != nil || !first {
//		return err // roll back; a duplicate needs no work
//	}
//	// ... business writes in tx, then commit: the record and the writes
//	// become visible together, or not at all.
//
// # Duplicates and concurrency
//
// Record inserts the key (consumer, message id) and reports whether it was
// new. When another transaction holds the same key uncommitted, the insert
// waits for it: if that transaction commits, Record reports a duplicate; if
// it rolls back, Record inserts. So two concurrent deliveries of one message
// run the handler once, and a failed attempt leaves nothing behind. At
// isolation levels above READ COMMITTED, Postgres reports the concurrent case
// as a serialization failure instead (SQLSTATE 40001); the message is then
// retried and found to be a duplicate.
//
// # Retention
//
// An inbox row is what recognizes a duplicate, so a duplicate that arrives
// after its row was cleaned is processed again. The retention window
// (CleanerConfig.Retention, DefaultRetention) must therefore be longer than
// the longest time after which the broker can deliver the same message again:
//
//   - Kafka: a consumer group re-reads from its last committed offset after a
//     crash or rebalance (minutes). When a group's committed offsets expire
//     (offsets.retention.minutes, 7 days by default) or someone resets them,
//     the group starts over from auto.offset.reset; with "earliest" it
//     replays everything still in the topic, up to the topic's
//     retention.ms (7 days by default, or forever for compacted topics).
//     Keep inbox rows at least as long as the topic keeps messages.
//   - RabbitMQ: unacknowledged messages come back when the consumer's channel
//     or connection closes (seconds to minutes), but a message parked in a
//     dead-letter queue and shovelled back by an operator can return days
//     later.
//   - The millbox forwarder and other at-least-once producers re-publish a
//     message whose delivery they could not confirm, typically within
//     seconds.
//
// DefaultRetention (14 days) covers Kafka's defaults with a margin. The cost
// of a longer window is disk: one small row per consumed message. Ids that
// are not globally unique over the window (Kafka offsets after a topic is
// recreated) make new messages look like duplicates; prefer message UUIDs.
//
// Cleaner deletes expired rows in batches of CleanerConfig.BatchSize, each
// batch its own short statement, oldest first, so it never holds many locks
// or a long transaction. On Postgres each batch starts where the previous
// one ended (see sqladapters.Dialect.DeleteInbox), so a batch costs the
// same late in a cleaning of millions of rows as at its start. Several
// cleaners may run against one table.
package inbox
