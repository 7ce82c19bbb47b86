// Package mover moves delayed messages from the outbox's table of
// scheduled messages into the outbox once they are due
// (sqladapters.Dialect.MoveDue). Every forwarder instance runs one,
// whatever its source: the rows a move writes are ordinary outbox
// inserts, which reach the instance owning them as any insert does. It
// may import sqladapters and the forwarder's internal helpers (retry,
// wake), never the forwarder or the engine.
package mover
