package sqladapters

import (
	"context"
	"time"
)

// Maintainer is implemented by a dialect whose tables need upkeep while
// they are in use, such as the time-partitioned Postgres outbox, whose
// partitions must be created ahead of time and dropped after retention.
// A forwarder calls Maintain when it starts and then every MaintainEvery.
type Maintainer interface {
	// Maintain does the upkeep once. It is idempotent and safe to call
	// from several processes at once: it returns nil at once when another
	// process is doing it. Given a DB it runs in short transactions of its
	// own and may hold two connections; given a transaction, it runs in
	// it. An error is worth logging, and the next call retries.
	Maintain(ctx context.Context, db Executor) error
	// MaintainEvery is how often to call Maintain. Zero or negative
	// means never: the tables need no upkeep, or the application runs it
	// on a schedule of its own.
	MaintainEvery() time.Duration
}
