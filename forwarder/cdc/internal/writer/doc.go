// Package writer runs the change-data-capture source's writes of
// messages of publishers without a table into the outbox's tables, one
// after the other in the order they were asked for, so that a key's
// messages get ascending ids in the order the stream brought them. It
// knows nothing of what is written: a job carries its write. It
// may import the forwarder's retry helper only.
package writer
