// Package pgoutput decodes the messages of PostgreSQL's pgoutput plugin
// into the outbox's committed transactions: the rows inserted into the
// outbox table (a requeued dead letter apart), and the messages of
// publishers without a table, written as logical decoding messages. It
// knows the outbox's columns and the format of those messages, nothing of
// the connection or of what the forwarder does with a transaction. It may import
// sqladapters and the emit encoding (forwarder/internal/emit), never the
// cdc source or the engine.
package pgoutput
