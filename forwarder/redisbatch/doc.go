// Package redisbatch is a Watermill publisher for Redis Streams that adds
// all the messages of one Publish call to the stream in one MULTI/EXEC
// transaction, one round trip, instead of one XADD round trip per message
// as watermill-redisstream's publisher does. The forwarder hands each
// key's consecutive messages to one Publish call (Config.PublishBatch), so
// with this publisher a key's backlog leaves in one round trip. Draining
// 100,000 rows of 200 keys from a PostgreSQL outbox into a local Redis on
// two cores, the forwarder moved about 22,000 messages per second with
// this publisher and 7,500 with watermill-redisstream's (Watermill's own
// forwarder: 870).
//
// The topic is the stream's key, and entries are encoded by a
// watermill-redisstream Marshaller (its default one unless
// Config.Marshaller says otherwise), so watermill-redisstream subscribers
// read them as usual.
//
// # Order
//
// A Redis stream keeps its entries in the order they were added, under
// increasing ids. The forwarder publishes a key's messages in commit order,
// one call at a time, and this publisher adds a call's messages in call
// order, so each key's messages are in the stream in commit order. A
// topic's keys share its stream, interleaved.
//
// A consumer sees that order when it reads the stream in order and handles
// an entry before it reads the next: XREAD, or a consumer group with a
// single consumer (watermill-redisstream's subscriber hands one entry at a
// time to the handler and waits for its ack). Several consumers in one
// group share the stream's entries between them and handle them in
// parallel; an entry nacked, or claimed from a consumer that went away
// (XCLAIM after MaxIdleTime), comes again after later ones. To consume a
// topic in parallel and keep each key's order, give each group of keys a
// stream of its own with the forwarder's Config.Topic, for example
//
//	Topic: func(topic string, m *message.Message) (string, error) {
//		return fmt.Sprintf("%s:%d", topic, uint32(forwarder.KeyHash(destination.Key(m)))%8), nil
//	},
//
// and run one consumer per stream. destination.Key is the ordering key the
// forwarder stored with the row, whatever metadata field the producer set
// it in.
//
// # Order under failure
//
// A batch publisher must never let a later message of a key be added after
// an earlier one failed, and must tell the forwarder exactly which
// messages were added (destination.PartialError). MULTI/EXEC makes a call
// all or nothing as far as Redis is concerned: if the connection is lost
// before EXEC, Redis discards the queued commands; if a command is refused
// while queued (out of memory), Redis discards the whole transaction
// (EXECABORT). Inside EXEC, XADD with an automatic id fails only for
// reasons that fail every later XADD to the same stream as well (the key
// holds another type, the stream's last id is the largest possible), so
// the entries added are a prefix of the call, and Publish reports that
// prefix. If the connection is lost after EXEC was sent, the call fails
// and publishing it again may add its entries a second time, behind the
// first ones: a duplicate, never a reordering.
//
// A message that cannot be added at all (a marshalling error, a field
// larger than MaxEntryBytes) ends the call before it: the messages ahead of
// it are added and reported as the delivered prefix, the rest are not
// sent.
//
// Failures of the server rather than of a message (unreachable, connection
// lost, no answer in time, loading its data after a restart, out of
// memory, a read-only replica after a failover, a cluster that is down or
// moving the slot) wrap destination.ErrDestinationUnavailable and say
// which of these happened, so the forwarder pauses behind one probe until
// the server is back.
//
// A call's time is that of its context: the forwarder sets the deadline of
// the messages' context at its PublishTimeout, so a call gives up when the
// forwarder stops waiting for it. Config.Timeout, when set, bounds a call
// further; go-redis lets the deadline reach the connection only with
// redis.Options.ContextTimeoutEnabled, and otherwise bounds each read and
// write by the client's ReadTimeout and WriteTimeout.
//
// This package is optional: it is the only part of millbox's library code
// that imports a Redis client, and a module of its own, so that the client
// stays out of the module graph of applications that do not use it:
//
//	go get github.com/millbox/millbox/forwarder/redisbatch
package redisbatch
