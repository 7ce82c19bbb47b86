package integration_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// someOwned prepares a Postgres outbox of 16 partitions of which another
// instance, alive for an hour, holds half, and writes perKey messages to
// each of 200 keys, one transaction per round over every key (so ids go
// round the keys). A forwarder started on it holds the other half.
func someOwned(t *testing.T, perKey int) (sqladapters.DB, *postgres.Dialect) {
	t.Helper()
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	ctx := testenv.Ctx(t, time.Minute)
	const partitions = 16
	if err := d.EnsurePartitions(ctx, db, partitions); err != nil {
		t.Fatal(err)
	}
	if err := d.Heartbeat(ctx, db, "other", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := d.ClaimPartitions(ctx, db, "other", time.Hour, partitions/2); err != nil {
		t.Fatal(err)
	}
	conformance.WriteKeyed(t, ctx, conformance.TxSource{Name: "pgxpool", Begin: beginOn(db)}, d, "t", 200, perKey, 1, 1)
	return db, d
}

// readSpy records the backlog flag of every pending read.
type readSpy struct {
	sqladapters.Dialect
	mu      sync.Mutex
	backlog []bool
}

func (s *readSpy) ReadPending(ctx context.Context, e sqladapters.Executor, q sqladapters.PendingQuery, backlog bool) ([]sqladapters.OutboxRow, error) {
	s.mu.Lock()
	s.backlog = append(s.backlog, backlog)
	s.mu.Unlock()
	return s.Dialect.ReadPending(ctx, e, q, backlog)
}

func (s *readSpy) flags() []bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]bool(nil), s.backlog...)
}

// The first read of an instance that holds some of the partitions runs
// with the settings for a backlog, as a read after a full one does: on
// Postgres, such a read of a large table is otherwise JIT-compiled (the
// planner cannot estimate key_hash % Partitions), which kept instances
// starting together on a backlog idle for seconds.
func TestPollingFirstReadOfSomePartitionsIsABacklogRead(t *testing.T) {
	db, d := someOwned(t, 2)
	spy := &readSpy{Dialect: d}
	rec := conformance.NewRecorder()
	var reads atomic.Int64
	f := conformance.StartForwarder(t, forwarder.Config{
		DB: db, Dialect: spy, Destination: rec, BatchSize: 1000,
		Source: forwarder.Polling{Partitions: 16},
		Hooks:  forwarder.Hooks{OnRead: func(int) { reads.Add(1) }},
	})
	for reads.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(f.Partitions()); n != 8 {
		t.Fatalf("the forwarder holds %d partitions, want 8", n)
	}
	if flags := spy.flags(); !flags[0] {
		t.Fatalf("the first read ran without the backlog settings (reads' backlog flags: %v)", flags)
	}
}

// gate is a destination whose calls wait until it opens.
type gate struct {
	open    chan struct{}
	entered atomic.Int64
}

func (g *gate) Publish(string, ...*message.Message) error {
	g.entered.Add(1)
	<-g.open
	return nil
}

func (g *gate) Close() error { return nil }

// A full read leads straight to the next read on an instance holding some
// of the partitions: the rows it returned go out in calls, which leaves
// the lanes room for more, and the next read starts then, not at the end
// of one of those calls. The calls here do not end until the test lets
// them, and the poll interval is an hour, so only the full read can lead
// to the second.
func TestPollingFullReadLeadsToTheNextRead(t *testing.T) {
	db, d := someOwned(t, 4)
	dest := &gate{open: make(chan struct{})}
	var reads atomic.Int64
	const batch = 50
	f := conformance.StartForwarder(t, forwarder.Config{
		DB: db, Dialect: d, Destination: dest, BatchSize: batch, DelayedPollInterval: time.Hour,
		Source: forwarder.Polling{PollInterval: time.Hour, Partitions: 16, WatchInterval: -1},
		Hooks:  forwarder.Hooks{OnRead: func(int) { reads.Add(1) }},
	})
	opened := sync.OnceFunc(func() { close(dest.open) })
	t.Cleanup(opened) // before the forwarder closes
	if n := len(f.Partitions()); n != 8 {
		t.Fatalf("the forwarder holds %d partitions, want 8", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for reads.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("after a full read of %d rows, whose %d calls are out, no second read followed within 30s", batch, dest.entered.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	opened()
}
