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
// config). As with watermill-amqp, publishing does not declare the queue,
// and a message no queue is bound for is confirmed and dropped.
//
// A queue hands its messages out in order to one consuming channel;
// several consumers of one queue handle them in parallel, and a key's
// messages with them. To consume a topic in parallel and keep each key's
// order, give each group of keys a queue of its own with the forwarder's
// Config.Topic on the ordering key the forwarder stored with the row
// (destination.Key), for example
//
//	Topic: func(topic string, m *message.Message) (string, error) {
//		return fmt.Sprintf("%s.%d", topic, uint32(forwarder.KeyHash(destination.Key(m)))%8), nil
//	},
//
// and run one consumer per queue.
//
// # Order under failure
//
// RabbitMQ keeps the order of the messages published on one channel: they
// are routed in publish order, and a queue stores the ones it accepts in
// that order (AMQP 0-9-1 section 4.7: one channel, one exchange, one queue,
// one consuming channel). A call's messages all go to one topic, on one
// channel, so they reach their queue in call order. Confirmations carry
// increasing delivery tags; the broker may confirm several at once, and
// messages become ready for confirmation at different times, so the
// confirmations of one call can arrive in any order. Publish therefore
// waits for all of them and reports the longest prefix of the call that was
// confirmed with an ack (destination.PartialError), which the forwarder
// counts as delivered.
//
// A message is not confirmed when the connection or the channel closes
// before its confirmation arrives (the client then reports it as not
// acknowledged, like a nack; Publish tells the two apart and says
// "connection to the broker lost"). Messages after it in the call were
// either never sent or sent on the same connection after it, so none of
// them reached a queue without it having reached it first; some may have
// reached it unconfirmed, and publishing again duplicates them.
//
// A nack is the broker refusing to take a message: RabbitMQ sends one when
// the queue process responsible for it fails, or when a queue with a length
// limit (x-max-length, x-max-length-bytes) and x-overflow reject-publish
// (or reject-publish-dlx) would go over its limit. A nack can then be
// followed by an ack of a later message of the same call: a queue limited
// in bytes rejects a large message and takes the smaller one after it,
// and any full queue takes messages again once a consumer made room. The
// queue then holds those later messages ahead of the rejected one, and
// consumers receive them first: the key's order is broken at that point,
// and publishing again from the rejected message delivers the later ones a
// second time after it. Publish reports the
// prefix before the rejected message and says in its error how many later
// messages were accepted after it. To make this impossible, set
// Config.ConfirmEach: each message is then published only after the
// previous one was confirmed, at one round trip per message. Queues
// without a length limit and reject-publish (the default) only nack on an
// internal error of the queue.
//
// Failures of the broker rather than of a message (unreachable, connection
// lost, no confirmation in time) wrap destination.ErrDestinationUnavailable;
// a nack or a channel closed by the broker (an unknown exchange, a refused
// permission) does not.
//
// A call's time is that of its context: the forwarder sets the deadline of
// the messages' context at its PublishTimeout, so a call gives up when the
// forwarder stops waiting for it. It bounds the wait for a free channel,
// connecting, opening a channel and the confirmations; Config.ConfirmTimeout,
// when set, bounds a call further.
//
// This package is optional: it is the only part of millbox's library code
// that imports an AMQP client, and a module of its own, so that the client
// stays out of the module graph of applications that do not use it:
//
//	go get github.com/millbox/millbox/forwarder/amqpbatch
package amqpbatch
