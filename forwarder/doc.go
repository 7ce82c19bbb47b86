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
// # Observability
//
// Publish stores the W3C trace context of each message's context in its
// metadata (PublisherConfig.Telemetry), so the trace of the request that
// wrote a message continues where the message is consumed. RegisterOutboxMetrics reports the pending and dead rows and the
// age of the oldest pending row of an outbox as gauges, whether or not a
// forwarder runs; HealthHandler serves liveness and readiness checks from a
// StatusSource. The Metric constants list the metric names.
package forwarder
