package forwarder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/sqladapters"
)

// Forwarder moves committed outbox rows to a destination publisher.
//
// Guarantees:
//   - at least once: a row leaves the outbox only after the destination's
//     Publish returned nil for it (or a PartialError counting it as
//     delivered);
//   - per-key order: rows with the same ordering key are published one
//     call at a time in outbox id order, also with many instances, because
//     a key's partition is leased by one instance at a time, a key's next
//     call starts only after the previous one succeeded, and a key whose
//     row failed holds its later rows back until that row is retried;
//   - independent keys: each key has its own lane. A slow, hanging or
//     failing Publish holds back only the rows of its own key; a call that
//     hangs past PublishTimeout counts as a failed attempt while the key
//     waits for it to return;
//   - a failing row is retried with exponential backoff and moved to the
//     dead letters after MaxAttempts;
//   - one outage is one event: when the destination itself is down
//     (connection refused or lost, or several keys failing in a row), the
//     forwarder stops reading and publishing, probes with one message at a
//     time, and resumes within about a second of the destination's return.
//     Such failures do not count as attempts.
//
// Structure: a dispatcher goroutine owns all in-flight state (dispatch.go);
// reads (read.go), Publish calls (call.go), failure records (failure.go)
// and deletes (ack.go) run on their own goroutines and report to it; the
// lease keeper (leases.go) asks it to go quiet before giving partitions
// back; the breaker (breaker.go) pauses it during outages.
type Forwarder struct {
	cfg      Config
	tel      *telemetry
	listener sqladapters.Listener
	channel  string

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	running chan struct{}
	runOnce sync.Once
	runErr  error // set before done is closed

	wakeCh  chan struct{}
	localCh <-chan struct{}

	// lease state, guarded by leaseMu
	leaseMu       sync.Mutex
	owned         []int
	leaseDeadline time.Time

	releases chan *releaseReq // to the dispatcher of the current Run
	short    atomic.Bool      // holding fewer partitions than the fair share

}

// New validates cfg and returns a forwarder. It starts nothing: call Run.
func New(cfg Config) (*Forwarder, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	tel, err := newTelemetry(cfg.Telemetry, cfg.Dialect)
	if err != nil {
		return nil, fmt.Errorf("millbox: forwarder telemetry: %w", err)
	}
	f := &Forwarder{
		tel:     tel,
		cfg:     cfg,
		done:    make(chan struct{}),
		running: make(chan struct{}),
		wakeCh:  make(chan struct{}, 1),
	}
	if l, ok := cfg.DB.(sqladapters.Listener); ok && cfg.Dialect.NotifyChannel() != "" {
		f.listener, f.channel = l, cfg.Dialect.NotifyChannel()
	}
	return f, nil
}

// Running is closed once the forwarder holds its first leases and, when it
// listens for notifications, knows whether they arrive (NotifyProbeInterval),
// or once Run has returned, whichever comes first: a caller waiting on it
// never hangs on a forwarder that could not start.
// Ready tells the two apart.
func (f *Forwarder) Running() <-chan struct{} { return f.running }

// Ready waits until the forwarder runs and returns nil, or returns why it
// will not: the error Run returned (missing tables, unreachable database,
// a Partitions mismatch), ErrClosed when it stopped, or ctx's error.
func (f *Forwarder) Ready(ctx context.Context) error {
	select {
	case <-f.running:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f.done:
		if f.runErr != nil {
			return f.runErr
		}
		return ErrClosed
	default:
		return nil
	}
}

// Run forwards until ctx ends or Close is called. It returns an error when
// the forwarder cannot start (unreachable database, missing tables, a
// Partitions value other instances disagree with); later database or
// broker failures are logged and retried, never returned.
func (f *Forwarder) Run(ctx context.Context) (err error) {
	f.mu.Lock()
	switch {
	case f.closed:
		f.mu.Unlock()
		return ErrClosed
	case f.started:
		f.mu.Unlock()
		return errors.New("millbox: forwarder is already running")
	}
	f.started = true
	ctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.mu.Unlock()
	defer func() {
		f.runErr = err
		close(f.done)
		f.runOnce.Do(func() { close(f.running) })
	}()
	defer cancel()

	if err := f.setup(ctx); err != nil {
		f.cfg.Logger.Error("millbox forwarder: cannot start", err, nil)
		return err
	}
	var local func()
	f.localCh, local = subscribeWake(f.cfg.Dialect.OutboxTable())
	defer local()
	if err := f.tel.observe(f.isRunning, func() int { return len(f.Partitions()) }); err != nil {
		f.cfg.Logger.Error("millbox forwarder: cannot register its gauges", err, nil)
	}
	defer func() { _ = f.tel.close() }()

	d := newDispatcher(f, ctx)
	f.releases = d.releases
	var wg sync.WaitGroup
	listening := make(chan struct{})
	if f.listener != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.listenLoop(ctx, listening)
		}()
	} else {
		close(listening)
	}
	if m, ok := f.cfg.Dialect.(sqladapters.Maintainer); ok && m.MaintainEvery() > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.maintainLoop(ctx, m)
		}()
	}
	leaseReady := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.leaseLoop(ctx, leaseReady)
	}()
	go func() {
		select {
		case <-leaseReady:
		case <-ctx.Done():
			return
		}
		select {
		case <-listening:
		case <-time.After(5 * time.Second): // polling covers a slow listener
		case <-ctx.Done():
			return
		}
		f.runOnce.Do(func() { close(f.running) })
	}()

	d.loop()

	// Shutdown: no call, read or failure record is in flight any more.
	// Flush deletes, then give the partitions back so other instances
	// take over at once.
	wg.Wait()
	d.del.close()
	f.leave()
	return nil
}

// Close stops Run gracefully: calls in flight finish (or their rows are
// left pending), published rows are deleted, and the partitions are
// released. It waits at most CloseTimeout.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	started, cancel := f.started, f.cancel
	f.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	select {
	case <-f.done:
		return nil
	case <-time.After(f.cfg.CloseTimeout):
		return fmt.Errorf("millbox: forwarder did not stop within CloseTimeout %v: a destination Publish call is blocking", f.cfg.CloseTimeout)
	}
}

func (f *Forwarder) setup(ctx context.Context) error {
	d := f.cfg.Dialect
	if err := d.EnsurePartitions(ctx, f.cfg.DB, f.cfg.Partitions); err != nil {
		return fmt.Errorf("millbox: forwarder start: %w", err)
	}
	n, err := d.CountPartitions(ctx, f.cfg.DB)
	if err != nil {
		return fmt.Errorf("millbox: forwarder start: %w", err)
	}
	if n != f.cfg.Partitions {
		return fmt.Errorf("%w: Config.Partitions is %d but the outbox %s is split into %d partitions; "+
			"every forwarder of one outbox must use the same value (to change it, stop them all and delete the rows of the _leases table)",
			ErrInvalidConfig, f.cfg.Partitions, d.OutboxTable(), n)
	}
	return nil
}

func (f *Forwarder) signal() {
	select {
	case f.wakeCh <- struct{}{}:
	default:
	}
}

// reportError remembers the latest error for Status and passes it to
// Hooks.OnError. Failed Publish calls are remembered by the telemetry's
// failed count.
func (f *Forwarder) reportError(err error) {
	if err == nil {
		return
	}
	f.tel.noteError(err)
	if f.cfg.Hooks.OnError != nil {
		f.cfg.Hooks.OnError(err)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// currentOwned returns the partitions to read; nil with ok means all.
func (f *Forwarder) currentOwned() ([]int, bool) {
	f.leaseMu.Lock()
	defer f.leaseMu.Unlock()
	if len(f.owned) == 0 || time.Now().After(f.leaseDeadline) {
		return nil, false
	}
	if len(f.owned) == f.cfg.Partitions {
		return nil, true
	}
	return f.owned, true
}

func (f *Forwarder) leaseValid() bool {
	f.leaseMu.Lock()
	defer f.leaseMu.Unlock()
	return len(f.owned) > 0 && time.Now().Before(f.leaseDeadline)
}

// isRunning tells whether Run is forwarding: started, holding leases, not
// yet returned.
func (f *Forwarder) isRunning() bool {
	select {
	case <-f.done:
		return false
	default:
	}
	select {
	case <-f.running:
		return true
	default:
		return false
	}
}

// Status reports the forwarder's state and the outbox's backlog, read
// from the database: whether it runs, the partitions it holds, its last
// successful publish and last error, pending and dead rows and the age of
// the oldest pending one. It serves HealthHandler.
func (f *Forwarder) Status(ctx context.Context) (Status, error) {
	stats, err := ReadOutboxStats(ctx, f.cfg.DB, f.cfg.Dialect)
	if err != nil {
		return Status{}, err
	}
	return f.tel.status(f.isRunning(), f.Partitions(), stats), nil
}

// maintainLoop runs the dialect's table maintenance (creating partitions
// ahead, dropping old ones) at start and every MaintainEvery. Failures are
// logged and retried at the next turn: maintenance is never urgent, and
// several instances running it at once is safe.
func (f *Forwarder) maintainLoop(ctx context.Context, m sqladapters.Maintainer) {
	for {
		if err := m.Maintain(ctx, f.cfg.DB); err != nil && ctx.Err() == nil {
			f.reportError(err)
			f.cfg.Logger.Error("millbox forwarder: outbox maintenance failed; trying again later", err,
				watermill.LogFields{"retry_in": m.MaintainEvery().String()})
		}
		t := time.NewTimer(m.MaintainEvery())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
