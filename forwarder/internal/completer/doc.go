// Package completer removes published rows from the outbox (or moves them
// to the table of forwarded rows kept for audit) in the background, in as
// few statements as the backlog allows, and reports each batch back once
// it is done with it. Rows of a replication stream may not be visible yet
// when they are published: a statement that does not find them tries
// again until their transaction is visible. It may import sqladapters and
// the forwarder's internal helpers (retry, source), never the engine.
package completer
