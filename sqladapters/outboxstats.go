package sqladapters

// OutboxStatsDialect is implemented by a dialect that reads the size of
// the outbox and the age of its oldest pending row in one statement, for
// metrics and health checks that run on every scrape. The built-in
// dialects implement it; without it, callers fall back to CountOutbox and
// report no age.
type OutboxStatsDialect interface {
	// OutboxStats selects three int columns: the number of pending rows
	// (including rows waiting for a retry), the number of dead rows, and
	// the age in microseconds, by the database's clock, of the pending row
	// with the lowest id (0 when none is pending). The lowest id stands in
	// for the oldest row so that the age costs one index lookup; the two
	// differ at most by how long the writing transaction stayed open.
	OutboxStats() Query
}
