package source

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/millbox/millbox/sqladapters"
)

// Row is an outbox row handed to the engine.
type Row struct {
	sqladapters.OutboxRow
	// Keyed tells that Key is an ordering key; a row without one has a
	// lane of its own.
	Keyed bool
	// Partition is the partition of the outbox the row belongs to: the
	// unit of ownership, and in exactly-once mode the unit of a
	// destination transaction. 0 for a source without partitions.
	Partition int
	// Created is when the row was written, on the local clock, for the
	// commit-to-acknowledgement latency; zero when unknown.
	Created time.Time
	// XID is the transaction that wrote the row, when the source saw the
	// row before its transaction may be visible to other sessions (a
	// replication stream); 0 otherwise. A failure record or a delete that
	// does not find such a row yet is tried again.
	XID uint32
	// Emitted tells that the row is in no table: a message of the outbox
	// without a table, decoded from the replication stream, with the id
	// its publisher drew from the outbox's sequence. Nothing deletes it
	// once delivered; its failed attempt is written through the source's
	// Storer, which puts it into the outbox table under that id, and the
	// engine then clears Emitted.
	Emitted bool
	// KeyHash places an Emitted row in a partition when it is written
	// into a table (forwarder.KeyHash).
	KeyHash int32
	// Tag is the source's own.
	Tag any
}

// Env is what a source is given when the forwarder opens it.
type Env struct {
	DB      sqladapters.DB
	Dialect sqladapters.Dialect
	Logger  watermill.LoggerAdapter
	// BatchSize is the most rows one read returns.
	BatchSize int
	// CloseTimeout bounds stopping.
	CloseTimeout time.Duration
	// Meter reports the source's own instruments; Attrs are the
	// attributes every forwarder metric carries.
	Meter metric.Meter
	Attrs []attribute.KeyValue
	// ReportError remembers err for Status and passes it to the
	// forwarder's OnError hook.
	ReportError func(err error)
	// Read reports one read of the table that returned n rows (metrics
	// and the OnRead hook).
	Read func(n int)
	// Database reports how the source's database answers: the error of
	// an operation that failed for want of the database (it is down, or
	// read-only after a failover), nil once one succeeded again. The
	// forwarder's Status says since when it fails.
	Database func(err error)
	// Active reports that this instance started (true) or stopped
	// (false) publishing: it came to hold partitions or holds none any
	// more, it became the active reader of a stream or stopped being it.
	// Any goroutine; the source calls it on changes only.
	Active func(active bool)
	// ExactlyOnce tells that the engine publishes in destination
	// transactions fenced per partition: the source acquires a partition
	// (Engine.Acquire) before it reads rows of it, and gives it up
	// (Engine.Release) when it no longer holds it.
	ExactlyOnce bool
	// Owner, when set, grants the source the whole outbox without leases
	// of its own: it holds every partition while Owner returns a time in
	// the future (the end of a lease held elsewhere, such as a fleet's
	// lease on a tenant), and keeps no lease or member rows in the
	// outbox's tables.
	Owner func() time.Time
	// Wake, when set, receives a value whenever the outbox may have new
	// rows that the source would not learn of by itself (a fleet's
	// doorbell): the source looks at once.
	Wake <-chan struct{}
	// Settings are the forwarder settings every instance of the outbox
	// must agree on. A source whose instances share the outbox records
	// them with its heartbeat (sqladapters.Dialect.HeartbeatSettings) and
	// refuses to start where a live instance recorded another value.
	Settings []sqladapters.Setting
	// DeadLetterHolds tells that a dead letter holds its key
	// (forwarder.Config.DeadLetterHoldsKey): the source hands the engine
	// no row of a key while a dead letter with a lower id holds it.
	DeadLetterHolds bool
}

// Engine is what the forwarding engine offers its source. Methods other
// than Do and Quiesce run on the engine's loop goroutine only.
type Engine interface {
	// Do runs fn on the loop goroutine and reports whether it will; it
	// returns false once the engine has stopped. Safe from any
	// goroutine, and it does not block on a busy loop for long.
	Do(fn func()) bool
	// Quiesce asks the engine to go quiet: no call, failure record or
	// delete in flight, and the source not Busy. It then runs fn, with the
	// engine paused, and resumes. Idle lanes are given back (Left) first.
	// Call it from a goroutine of the source, never from the loop. It
	// returns ctx's error, or fn's.
	Quiesce(ctx context.Context, fn func() error) error

	// Grant tells whether the source may read the table now: the engine
	// has room for more rows and is not paused. While the destination is
	// down it grants one read per probe, to find a row to probe with.
	Grant() bool
	// Room tells, without granting anything, whether Grant would.
	Room() bool
	// Add queues rows on their lanes and returns those the engine does
	// not take now: while paused or stopping, and rows of a key whose lane
	// holds it back (a failure being recorded or waiting out its
	// backoff, a call past its PublishTimeout). The source keeps no state
	// for rejected rows: they stay in the table.
	Add(rows []*Row) (rejected []*Row)
	// HeldKeys lists the ordering keys whose rows Add rejects until their
	// lane is given back, and which the database does not hold back by
	// itself: a call that hangs, a failure that could not be recorded.
	// Reads leave them out, so a hung key's backlog cannot fill them.
	HeldKeys() []string
	// Holds tells whether the engine has anything of the key in a lane,
	// queued, in a call or being recorded. For keyed false it tells
	// whether any row without a key is.
	Holds(key string, keyed bool) bool
	// Yield gives back (Left) the rows of key's lane that are not in a
	// call: a row of the key with a lower id became pending again (a
	// requeued dead letter), and the source publishes the key's rows in
	// id order from the table.
	Yield(key string)
	// SetPaused stops (true) or resumes calls. Pausing gives idle lanes
	// back (Left); calls in flight finish.
	SetPaused(paused bool)
	// Stopping tells that the forwarder is shutting down.
	Stopping() bool
	// Started tells that the source runs: whoever waits for readiness is
	// released. Safe from any goroutine.
	Started()

	// Acquire makes partitions the source now holds ready for rows, and
	// returns those it made ready (all of them unless err). In
	// exactly-once mode it fences every earlier holder of each partition
	// at the destination and completes the rows the last committed
	// transaction of the partition published; otherwise it does nothing.
	// The engine rejects rows of partitions not acquired (Add). Call it
	// from a goroutine of the source, never from the loop; it may take as
	// long as the destination does.
	Acquire(ctx context.Context, partitions []int) (acquired []int, err error)
	// Release tells that the source no longer holds partitions: the
	// engine takes no more of their rows and lets the destination's
	// resources for them go once their transaction in flight ended. Safe
	// from any goroutine.
	Release(partitions []int)
}

// Storer is implemented by a source whose rows may be Emitted. The engine
// records a failed attempt of such a row through it, on its loop:
// StoreFailure writes the row into the outbox table with the attempt f
// (into the dead letters when f.Dead), after every table write the source
// started before, and then calls done on the loop with the row's id, or
// the error.
type Storer interface {
	StoreFailure(row *Row, f sqladapters.Failure, done func(id int64, err error))
}

// Source is where the engine finds rows and whom it tells what became of
// them.
type Source interface {
	// Prepare checks what the source needs before the forwarder runs (the
	// tables, settings, privileges) and says how to fix what is missing.
	// An error ends Run.
	Prepare(ctx context.Context) error
	// Start starts the source's goroutines with the engine e, before the
	// engine's loop runs, and returns a function that waits until they
	// have all ended, after ctx ended.
	Start(ctx context.Context, e Engine) (wait func())
	// Step starts what is due, such as a read; the loop calls it after
	// every event.
	Step()
	// Feed returns the channel of rows the source pushes (a replication
	// stream): the loop runs each closure while it has room, so a source
	// that pushes is held back by the engine's buffers. Nil when the
	// source only reads.
	Feed() <-chan func()
	// Delivered reports rows the destination acknowledged.
	Delivered(rows []*Row)
	// Completed reports delivered rows removed from the outbox (or
	// kept, with KeepForwarded).
	Completed(rows []*Row)
	// Left reports rows the engine gave up: they stay in the outbox,
	// pending or with a recorded failure, for the source to find again.
	// A row whose call passed PublishTimeout is left once its failure is
	// recorded; if the call delivers it after all, Delivered and
	// Completed follow.
	Left(rows []*Row)
	// Busy tells whether the source has work in flight (a read) that the
	// engine must wait for before it is quiet.
	Busy() bool
	// Lost tells, in exactly-once mode, that the engine cannot publish
	// rows of partition until it is acquired again: a transaction's
	// outcome is unknown (the destination failed while committing, or
	// another holder fenced this one), or published rows could not be
	// removed. The engine gave back the partition's rows; the source
	// reads none of them before Acquire succeeded again, which completes
	// the rows that were published after all.
	Lost(partition int)
	// Partitions returns the partitions of the outbox the source holds
	// now, ascending. Safe from any goroutine.
	Partitions() []int
	// Close gives up what the source holds (leases, a replication
	// connection) once the engine has stopped.
	Close()
}
