// Package kafkaid builds inbox message ids from a Kafka record's topic,
// partition and offset, as consumed through watermill-kafka v3. It is a
// module of its own, so that millbox/middleware does not import Kafka client
// code and the client stays out of the module graph of applications that
// do not use it:
//
//	go get github.com/millbox/millbox/middleware/kafkaid
//
// An offset id recognizes redeliveries of the same Kafka record: after a
// crash, a rebalance or an offset reset. It does not recognize a message
// that was produced twice (a producer retry, an outbox row forwarded again):
// that is a new record with a new offset. Prefer the Watermill UUID
// (middleware.UUIDID, the default), which the millbox forwarder keeps, and
// use offsets for producers that set no stable id. Offsets start again at 0
// when a topic is deleted and recreated: clean the consumer's inbox rows
// then, or new records are taken for duplicates.
package kafkaid
