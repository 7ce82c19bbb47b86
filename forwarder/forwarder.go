package forwarder

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/engine"
	"github.com/millbox/millbox/forwarder/internal/mover"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/forwarder/telemetry"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/startstop"
)

// Forwarder moves committed outbox rows to a destination publisher. It is
// one engine driving one source of rows (Config.Source): Polling reads
// the outbox table, cdc.Source streams its inserts from PostgreSQL's
// logical replication. Every guarantee below holds for both.
//
// Guarantees:
//   - at least once: a row leaves the outbox only after the destination's
//     Publish returned nil for it (or a PartialError counting it as
//     delivered); exactly once for read_committed consumers with
//     Config.ExactlyOnce and a TxDestination (see the package doc);
//   - per-key order: rows with the same ordering key are published one
//     call at a time in the order they were written (committed, for
//     cdc.Source), also with many instances, because one instance at a
//     time owns a key (its partition's lease, or the replication slot), a
//     key's next call starts only after the previous one succeeded, and a
//     key whose row failed holds its later rows back until that row is
//     retried;
//   - independent keys: each key has its own lane. A slow, hanging or
//     failing Publish holds back only the rows of its own key: reads and
//     calls for other keys go on while it hangs. A call that hangs past
//     PublishTimeout counts as a failed attempt while the key waits for it
//     to return;
//   - a failing row is retried as Config.Retry says and moved to the dead
//     letters after MaxAttempts;
//   - one outage is one event: when the destination itself is down
//     (connection refused or lost, or several keys failing in a row), the
//     forwarder stops reading and publishing, probes with one message at a
//     time, and resumes within about a second of the destination's return.
//     Such failures do not count as attempts.
//
// Structure: the forwarder wires a source (package forwarder/polling, or
// forwarder/cdc) to the engine (forwarder/internal/engine), which owns
// lanes, calls, failures, the breaker and deletes, and reports what it
// does to the forwarder's telemetry and hooks; a mover per instance moves
// delayed messages that came due (forwarder/internal/mover).
type Forwarder struct {
	cfg    Config
	tel    *telemetry.Recorder
	src    source.Source
	txDest destination.TxDestination // with ExactlyOnce
	life   startstop.Base

	incidents sync.Mutex // guards the three below
	dbDown    time.Time  // since when the database fails, zero while it answers
	gap       string     // the last stretch of history no source could read
	gapAt     time.Time
	// Config.Wake fans out to the source and the mover.
	srcWake, moverWake chan struct{}
}

// New validates cfg and returns a forwarder. It starts nothing: call Run.
func New(cfg Config) (*Forwarder, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tel, err := telemetry.NewRecorder(cfg.Telemetry, cfg.Dialect)
	if err != nil {
		return nil, fmt.Errorf("millbox: forwarder telemetry: %w", err)
	}
	f := &Forwarder{cfg: cfg, tel: tel}
	if cfg.Wake != nil {
		f.srcWake, f.moverWake = make(chan struct{}, 1), make(chan struct{}, 1)
	}
	if cfg.ExactlyOnce {
		f.txDest = cfg.Destination.(destination.TxDestination)
	}
	f.src, err = cfg.Source.Open(source.Env{
		DB:              cfg.DB,
		Dialect:         cfg.Dialect,
		Logger:          cfg.Logger,
		BatchSize:       cfg.BatchSize,
		CloseTimeout:    cfg.CloseTimeout,
		Meter:           tel.Meter(),
		Attrs:           tel.Attrs(),
		ReportError:     f.reportError,
		Read:            f.read,
		Database:        f.database,
		Active:          f.active,
		Wake:            f.srcWake,
		ExactlyOnce:     cfg.ExactlyOnce,
		DeadLetterHolds: cfg.DeadLetterHoldsKey,
		Settings: []sqladapters.Setting{
			{Name: "Config.DeadLetterHoldsKey", Value: strconv.FormatBool(cfg.DeadLetterHoldsKey)},
			{Name: "Config.ExactlyOnce", Value: strconv.FormatBool(cfg.ExactlyOnce)},
		},
	})
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Running is closed once the forwarder runs (with Polling: holds its first
// leases, in exactly-once mode has tried to claim them at the destination,
// and, when it listens for notifications, knows whether they arrive; with
// cdc.Source: has checked the database, whether it then streams or stands
// by), or once Run has returned, whichever comes first:
// a caller waiting on it never hangs on a forwarder that could not start.
// Ready tells the two apart.
func (f *Forwarder) Running() <-chan struct{} { return f.life.Running() }

// Ready waits until the forwarder runs and returns nil, or returns why it
// will not: the error Run returned (missing tables, unreachable database,
// a Partitions mismatch, wal_level), ErrClosed when it stopped, or ctx's
// error.
func (f *Forwarder) Ready(ctx context.Context) error { return f.life.Ready(ctx) }

// Run forwards until ctx ends or Close is called. It returns an error when
// the forwarder cannot start (unreachable database, missing tables, a
// Partitions value other instances disagree with, a replication setting);
// later database or broker failures are logged and retried, never
// returned.
func (f *Forwarder) Run(ctx context.Context) error {
	ctx, err := f.life.Begin(ctx)
	if err != nil {
		return err
	}
	return f.life.End(f.run(ctx))
}

func (f *Forwarder) run(ctx context.Context) error {
	if err := f.start(ctx); err != nil {
		f.cfg.Logger.Error("millbox forwarder: cannot start", err, nil)
		return err
	}
	if err := f.tel.Observe(f.isRunning, func() int { return len(f.src.Partitions()) }); err != nil {
		f.cfg.Logger.Error("millbox forwarder: cannot register its gauges", err, nil)
	}
	defer func() { _ = f.tel.Close() }()

	moving := make(chan struct{})
	go func() {
		defer close(moving)
		mover.Run(ctx, mover.Config{
			DB: f.cfg.DB, Dialect: f.cfg.Dialect, Interval: f.cfg.DelayedPollInterval, BatchSize: f.cfg.BatchSize,
			Logger: f.cfg.Logger, ReportError: f.reportError, Wake: f.moverWake,
		})
	}()
	waking := make(chan struct{})
	go func() {
		defer close(waking)
		if f.cfg.Wake != nil {
			f.fanOutWakes(ctx)
		}
	}()
	engine.New(engine.Config{
		DB:                 f.cfg.DB,
		Dialect:            f.cfg.Dialect,
		Destination:        f.cfg.Destination,
		Tx:                 f.txDest,
		Topic:              f.cfg.Topic,
		BatchSize:          f.cfg.BatchSize,
		Concurrency:        f.cfg.Concurrency,
		PublishBatch:       f.cfg.PublishBatch,
		PublishTimeout:     f.cfg.PublishTimeout,
		CloseTimeout:       f.cfg.CloseTimeout,
		Retry:              f.cfg.Retry,
		MaxAttempts:        f.cfg.MaxAttempts,
		DeadLetterHoldsKey: f.cfg.DeadLetterHoldsKey,
		KeepForwarded:      f.cfg.KeepForwarded,
		Logger:             f.cfg.Logger,
		Observer:           observer{f},
		Started:            f.life.Started,
	}, f.src).Run(ctx)
	<-moving
	<-waking
	// Nothing is in flight any more: the source hands over what it holds.
	f.src.Close()
	return nil
}

// start checks what the forwarder needs before it runs: the source's
// tables and settings, the destination's transactions in exactly-once
// mode, and the table of scheduled messages.
func (f *Forwarder) start(ctx context.Context) error {
	if err := f.src.Prepare(ctx); err != nil {
		return err
	}
	if f.txDest != nil {
		if err := f.txDest.PrepareTx(ctx); err != nil {
			return fmt.Errorf("millbox: forwarder start: exactly once: %w", err)
		}
	}
	// Refuse to start on a schema without the table of scheduled
	// messages rather than leave them where nothing moves them.
	if _, _, err := f.cfg.Dialect.MoveDue(ctx, f.cfg.DB, time.Time{}, 1); errors.Is(err, sqladapters.ErrMissingTable) {
		return fmt.Errorf("millbox: forwarder start: scheduled messages: %w", err)
	}
	return nil
}

// Close stops Run gracefully: calls in flight finish (or their rows are
// left pending), published rows are deleted, and the source hands over at
// once (partitions released, the replication slot confirmed and let go).
// It waits at most CloseTimeout.
func (f *Forwarder) Close() error {
	err := f.life.Close(f.cfg.CloseTimeout, "forwarder")
	if err != nil {
		return fmt.Errorf("%w: a destination Publish call is blocking", err)
	}
	return nil
}

// fanOutWakes hands each value of Config.Wake to the source and the
// mover, until ctx ends.
func (f *Forwarder) fanOutWakes(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.cfg.Wake:
			for _, ch := range []chan struct{}{f.srcWake, f.moverWake} {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}
}

// reportError remembers the latest error for Status and passes it to
// Hooks.OnError.
func (f *Forwarder) reportError(err error) {
	if err == nil {
		return
	}
	var gap interface{ Gap() string }
	if errors.As(err, &gap) {
		f.incidents.Lock()
		f.gap, f.gapAt = gap.Gap(), time.Now()
		f.incidents.Unlock()
	}
	f.tel.NoteError(err)
	if f.cfg.Hooks.OnError != nil {
		f.cfg.Hooks.OnError(err)
	}
}

// database notes whether the source's database answers.
func (f *Forwarder) database(err error) {
	f.incidents.Lock()
	defer f.incidents.Unlock()
	switch {
	case err == nil:
		f.dbDown = time.Time{}
	case f.dbDown.IsZero():
		f.dbDown = time.Now()
	}
}

// read reports one read of the outbox table.
func (f *Forwarder) read(n int) {
	f.tel.BatchSize(context.Background(), n)
	if hook := f.cfg.Hooks.OnRead; hook != nil {
		hook(n)
	}
}

// active reports that this instance started or stopped publishing.
func (f *Forwarder) active(active bool) {
	if hook := f.cfg.Hooks.OnActive; hook != nil {
		hook(active)
	}
}

// isRunning tells whether Run is forwarding: started, not yet returned.
func (f *Forwarder) isRunning() bool {
	select {
	case <-f.life.Running():
		return f.life.Ready(context.Background()) == nil
	default:
		return false
	}
}

// Partitions returns the partitions of the outbox this instance holds
// now, ascending: its leases with Polling; with cdc.Source, partition 0
// while it is the active reader of the slot and none while it stands by.
func (f *Forwarder) Partitions() []int { return f.src.Partitions() }

// Status reports the forwarder's state and the outbox's backlog, read
// from the database: whether it runs, the partitions it holds, its last
// successful publish and last error, whether its database answers, and
// the outbox's stats. When the stats cannot be read it returns the error
// with the rest of the Status. It serves HealthHandler.
func (f *Forwarder) Status(ctx context.Context) (Status, error) {
	stats, err := f.cfg.Dialect.OutboxStats(ctx, f.cfg.DB)
	if err != nil {
		err = fmt.Errorf("millbox: read the outbox's stats: %w", err)
	}
	s := Status{Running: f.isRunning(), Partitions: f.Partitions(), OutboxStats: stats}
	s.LastPublish, s.LastError, s.LastErrorAt = f.tel.Health()
	f.incidents.Lock()
	s.DatabaseDownSince, s.Gap, s.GapAt = f.dbDown, f.gap, f.gapAt
	f.incidents.Unlock()
	return s, err
}

// observer turns what the engine does into telemetry and the user's
// hooks.
type observer struct{ f *Forwarder }

func (o observer) StartSend(ctx context.Context, topic string, msgs []*message.Message) (context.Context, func(error)) {
	return o.f.tel.StartSend(ctx, topic, msgs)
}

func (o observer) Called(ctx context.Context, topic string, took time.Duration, err error) {
	o.f.tel.PublishDuration(ctx, topic, took, err)
}

func (o observer) Sent(topic string, n int) { o.f.tel.Sent(context.Background(), topic, n) }

func (o observer) Failed(topic string, n int, err error) {
	o.f.tel.Failed(context.Background(), topic, n, err)
}

func (o observer) Acked(topic string, age time.Duration) {
	o.f.tel.CommitToAck(context.Background(), topic, age)
}

func (o observer) Batch(b engine.Batch) {
	if hook := o.f.cfg.Hooks.OnBatch; hook != nil {
		hook(BatchStats{Messages: b.Messages, Forwarded: b.Forwarded, Failed: b.Failed, Duration: b.Duration})
	}
}

func (o observer) Failure(a engine.Failure) {
	if a.Dead {
		o.f.tel.DeadLettered(context.Background(), a.Topic, 1)
	}
	if hook := o.f.cfg.Hooks.OnFailure; hook != nil {
		hook(FailedAttempt{
			ID: a.ID, UUID: a.UUID, Topic: a.Topic, Key: a.Key,
			Attempts: a.Attempts, Error: a.Error, Backoff: a.Backoff, Dead: a.Dead,
		})
	}
}

func (o observer) Error(err error) { o.f.reportError(err) }
