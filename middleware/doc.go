// Package middleware holds millbox's Watermill handler middleware: the
// inbox, which runs a handler effectively once per message.
//
// For each message the inbox middleware begins a transaction, records the
// message id in the inbox table (package inbox), runs the handler with the
// transaction in the message's context, and commits. With pgx (pgxv5) the
// BEGIN and the inbox insert go to the server in one round trip
// (inbox.Inbox.BeginRecord), so the inbox adds no round trip to the
// handler's own transaction:
//
//   - duplicate (the id is already recorded): roll back, skip the handler,
//     return no error, so the router acks the message;
//   - handler error: roll back, return the error, so the router nacks and
//     the broker redelivers; neither the handler's writes nor the inbox row
//     remain;
//   - handler panic: roll back, then panic again for Recoverer or the router
//     to handle;
//   - success: commit; a failed commit is returned as an error (nack).
//
// # Guarantees
//
//   - Effectively once. The inbox row and the handler's writes commit in
//     one transaction, so a redelivered message (a broker redelivery, a
//     forwarder's duplicate, a consumer killed after its commit but before
//     its ack) is acked without running the handler again.
//   - Concurrent duplicates. Two deliveries of one message that overlap in
//     time run the handler once: the second waits on the first's inbox row
//     and sees a duplicate once the first commits. On PostgreSQL at
//     REPEATABLE READ or SERIALIZABLE (InboxConfig.TxOptions) the second
//     fails with a serialization error instead, and is redelivered and
//     then skipped.
//   - Within the retention. A duplicate that arrives after its inbox row
//     was cleaned runs again: keep inbox.CleanerConfig.Retention (14 days
//     by default) longer than the broker can redeliver (see package inbox).
//
// "Once" covers what the handler does in the transaction. An attempt that
// fails is rolled back and runs again, so side effects outside the
// transaction (HTTP calls, publishing straight to a broker) happen once per
// attempt; make them idempotent or move them behind the outbox.
//
// Example_inboxMiddleware in package sqladapters/sqlite/modernc runs a
// message delivered twice through the middleware on SQLite and shows its
// handler's write made once.
//
// Each message in flight holds a database connection from begin to commit,
// and so does a concurrent duplicate while it waits: size the pool for the
// number of messages the subscriber hands out at once (Kafka partitions,
// RabbitMQ prefetch, GoChannel publishers).
//
// # Using the transaction in the handler
//
// The handler gets the driver transaction from its message's context with
// one call and does its business writes there:
//
//	tx, err := pgxv5.TxFromContext(msg.Context()) // pgx.Tx
//	tx, err := stdsql.TxFromContext(msg.Context()) // *sql.Tx
//
// A long-lived outbox publisher (forwarder.NewContextPublisher, for example
// behind a cqrs.EventBus) finds the same transaction in the context of the
// messages it publishes. Give those messages the handler's context
// (msg.SetContext(handlerMsg.Context()), or pass the handler's ctx to
// EventBus.Publish) and the events commit atomically with the handler's
// writes and its inbox row: consume, process and produce happen together or
// not at all.
//
// Messages the handler returns are different: the router publishes them
// after the middleware has committed, so a crash in between loses them, and
// a redelivery finds a duplicate and does not produce them again. Publish
// follow-up events through the outbox publisher instead.
//
// # Ordering with Watermill's middleware
//
// Watermill runs middleware in the order it was added, the first added
// outermost. Add the inbox last, closest to the handler:
//
//	router.AddMiddleware(
//		poisonQueue,                      // outermost: sees the final error
//		middleware.Retry{...}.Middleware, // each attempt gets a fresh transaction
//		middleware.Recoverer,             // a panic becomes an error Retry can see
//		inboxMiddleware,
//	)
//
// Why this order:
//
//   - Retry must wrap the inbox: a failed attempt rolls back its
//     transaction and the next attempt begins a new one. With Retry inside
//     the inbox, every retry would run in the same transaction, which
//     Postgres aborts at the first failed statement.
//   - Recoverer belongs inside Retry so that panics are retried. The inbox
//     rolls back either way: a panic passing through it rolls back in a
//     deferred call and continues, an error returned by Recoverer rolls back
//     like any handler error.
//   - PoisonQueue goes outside Retry, so only the final error poisons. The
//     poisoned message is acked without an inbox row: if the broker delivers
//     it again it is processed, and poisoned, again. Its publisher must be a
//     broker publisher, not the context outbox publisher: by then the inbox
//     has rolled back and restored the message's original context, which
//     holds no transaction.
//   - Timeout outside the inbox bounds the whole transaction.
//   - Do not combine with InstantAck: it acks before the transaction
//     commits, so a crash loses the message.
//
// # cqrs.EventProcessor and several handlers
//
// cqrs.EventProcessor turns each event handler into a router handler with
// its own subscription, so one event is delivered to every handler of its
// type with the same UUID. The middleware therefore records the consumer as
// Consumer + "/" + the router handler name (message.HandlerNameFromCtx), and
// one middleware added with router.AddMiddleware keeps handlers apart. Set
// InboxConfig.SharedAcrossHandlers to record Consumer alone, for example when
// several router handlers with different names are one logical consumer.
//
// # Message ids
//
// The id is the Watermill message UUID by default; the millbox forwarder
// and most producers keep it across redeliveries and re-publishes.
// MetadataID reads it from a metadata field instead, and the kafkaid
// subpackage builds it from the Kafka topic, partition and offset (which
// only recognizes redeliveries of the same Kafka record, not a message
// produced twice). A message without an id fails with an error wrapping
// ErrNoMessageID before any transaction begins. Redelivery cannot fix that,
// so route it to a poison queue:
//
//	middleware.PoisonQueueWithFilter(pub, "poison", func(err error) bool {
//		return errors.Is(err, millboxmw.ErrNoMessageID)
//	})
//
// Without a poison queue the router nacks it, and the broker redelivers it
// for ever.
//
// # Telemetry
//
// The middleware reads the producer's trace context from the message
// metadata (the outbox publisher stores it there, and Kafka and RabbitMQ
// carry it as headers) and runs the handler in a "process" span: a child of
// the producer's span, or of the span a router's tracing middleware already
// put in the message's context, linked to the producer's. The handler's
// context carries the span, so outbox publishes from the handler continue
// the same trace. The span and the metrics MetricConsumedMessages and
// MetricProcessDuration say whether the message was a duplicate
// (millbox.inbox.duplicate) and why it failed (error.type); no attribute
// names a message. InboxConfig.Telemetry chooses the providers, which
// default to OpenTelemetry's global ones.
package middleware
