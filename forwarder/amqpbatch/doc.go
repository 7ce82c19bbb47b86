// Package amqpbatch is a Watermill publisher for RabbitMQ that publishes all
// the messages of one Publish call on one channel with publisher confirms
// and waits for their confirmations together, instead of one confirmation
// round trip per message as watermill-amqp's publisher does. The forwarder
// hands each key's consecutive messages to one Publish call
// (Config.PublishBatch), so a key's backlog costs one round trip.
//
// Messages are marshaled with a watermill-amqp Marshaler, so
// watermill-amqp subscribers read them as usual. By default a message goes
// to the default exchange with the topic as routing key, which delivers it
// to the queue named like the topic (watermill-amqp's durable queue
// config). As with watermill-amqp, publishing does not declare the queue.
//
// This package is optional: it is the only part of millbox's library code
// that imports an AMQP client.
package amqpbatch
