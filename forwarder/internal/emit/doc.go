// Package emit is the encoding of the outbox without a table: the messages
// of one Publish call, written into PostgreSQL's write-ahead log as one
// logical decoding message (pg_logical_emit_message) by the publisher and
// decoded from the replication stream by the change-data-capture source.
//
// A record is, in order:
//
//	byte     version (Version)
//	uvarint  length of the topic, then the topic (UTF-8)
//	uvarint  number of messages
//
// and per message:
//
//	byte     flags: bit 0 set when the message has an ordering key
//	uvarint  key hash (forwarder.KeyHash of the key, or of the UUID)
//	uvarint  length, bytes: UUID
//	uvarint  length, bytes: ordering key (only with bit 0)
//	uvarint  length, bytes: metadata (a JSON object of strings, the trace
//	         context included, as the outbox table stores it)
//	uvarint  length, bytes: payload
//
// and then, appended by the database as it writes the record, the
// messages' ids: one 8-byte big-endian integer per message, in order,
// drawn from the outbox's id sequence in the writing transaction. A
// message written into a table later keeps its id, so a key's messages
// and the rows of publishers with a table keep one order there.
//
// Lengths and counts are Go's unsigned varints (encoding/binary). A reader
// refuses a record of a version it does not know, rather than skip it: a
// forwarder older than its publishers must be upgraded, never lose their
// messages.
//
// It imports sqladapters only, so that the publisher and the decoder share
// it without importing each other.
package emit
