// Package exampleenv is the plumbing the example programs share and none
// of them is about: where the local services are, a Kafka to run against
// (in process, or real brokers) and the removal of a run's topics and
// groups, a consumer-group subscriber, the removal of a RabbitMQ queue, and
// a forwarder running in the background.
//
// What the examples teach stays in each of them: opening the database, the
// dialect options, Migrate, the outbox publisher inside the application's
// transaction, forwarder.Config, the inbox middleware and the broker
// publisher settings. To copy an example into an application, replace the
// calls into this package with the application's own service set-up.
package exampleenv
