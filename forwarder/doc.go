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
package forwarder
