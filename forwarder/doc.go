// Package forwarder is millbox's outbox: a Watermill message.Publisher that
// writes messages into the outbox table inside the application's own
// transaction, and the Forwarder that moves committed rows to any Watermill
// message.Publisher (Kafka, RabbitMQ, ...), at least once, in order per key.
//
// Publisher has two modes. NewPublisher binds it to one transaction.
// NewContextPublisher makes a long-lived publisher that finds the
// transaction in each message's context (put there by sqladapters.WithTx or
// by the inbox middleware), so one cqrs.EventBus can serve a whole
// application. Either way a message never goes out without a transaction.
//
// # Reading a large outbox
//
// A forwarder reads due rows in id order. The entries of the rows it
// deleted stay in the database's index until vacuum removes them, and a
// read from the first row walks them all: tens of milliseconds per read
// after a few million rows drained between two vacuums. On Postgres
// (sqladapters.Features.Horizon) the forwarder reads past them: once per
// PollInterval a head read starts at the first row, between two looks at
// the id sequence and the oldest running transaction
// (sqladapters.Dialect.PendingHorizon), and sets a floor below which no
// row is pending or can still become visible; the reads in between start
// after it. Where a look fails (a sequence with CACHE above 1, a role that
// may not read the sequence), the forwarder logs why and reads from the
// first row. Rows handed back to the outbox (a failed attempt, a lane given
// up) and rows waiting for a retry lower the floor, so a key's order
// holds. The floor relies on each row's transaction having its
// transaction id before the row's id is drawn, which millbox's publisher
// ensures. A row inserted into the outbox table by other means, in a
// transaction that has written nothing before, could in a rare race be
// left to the next head read, up to PollInterval later, and be overtaken
// by a later row of its key.
//
// # Observability
//
// Publish stores the W3C trace context of each message's context in its
// metadata (PublisherConfig.Telemetry), so the trace of the request that
// wrote a message continues where the message is consumed. RegisterOutboxMetrics reports the pending and dead rows and the
// age of the oldest pending row of an outbox as gauges, whether or not a
// forwarder runs; HealthHandler serves liveness and readiness checks from a
// StatusSource. The Metric constants list the metric names.
package forwarder
