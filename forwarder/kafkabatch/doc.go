// Package kafkabatch is a Watermill publisher for Kafka that sends all the
// messages of one Publish call in one batch (sarama's SendMessages), instead
// of one synchronous round trip per message as watermill-kafka's publisher
// does. The forwarder hands each key's consecutive messages to one Publish
// call (Config.PublishBatch), so with this publisher a key's backlog leaves
// in one round trip.
//
// Messages are marshaled with a watermill-kafka Marshaler, so consumers
// using watermill-kafka's subscriber read them as usual. The default
// marshaler uses the forwarder's ordering key (metadata "partition_key") as
// the Kafka record key.
//
// This package is optional: it is the only part of millbox's library code
// that imports a Kafka client.
package kafkabatch
