package polling

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/forwarder/internal/wake"
	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Source.
const (
	DefaultPollInterval        = time.Second
	DefaultPartitions          = 16
	DefaultLeaseTTL            = 15 * time.Second
	DefaultWatchInterval       = 5 * time.Millisecond
	DefaultNotifyProbeInterval = 30 * time.Second
)

// Source is the source that reads the outbox table, on every database:
// rows are read in id order, and instances share the outbox by leasing
// partitions of its keys. It finds new rows by watching the outbox's
// high-water mark (WatchInterval); when the DB can listen for
// notifications (pgxv5.WrapPool) and the dialect notifies
// (postgres.Options.Notify), it wakes up on every commit instead. Behind
// PgBouncer in transaction pooling, give the listener a connection of its
// own: pgxv5.WrapPool(pool, pgxv5.ListenOn(directURL)).
type Source struct {
	// PollInterval is how often an idle forwarder reads the outbox table
	// when nothing told it of new rows; it also finds rows whose retry
	// came due. On a database that reports a horizon (PostgreSQL), reads
	// start after the rows already forwarded and one read per
	// PollInterval starts at the first row, so a row that becomes pending
	// below them again (a dead letter requeued by an operator) waits at
	// most this long. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// Partitions splits the outbox by ordering key between forwarder
	// instances: each partition is leased by one instance at a time, and
	// instances share them evenly. Every instance of one outbox must use
	// the same value. Defaults to DefaultPartitions.
	Partitions int
	// LeaseTTL is how long a partition lease lasts without renewal. A
	// crashed instance's partitions move to others after it. Renewal
	// happens every LeaseTTL/3; an instance that joins or leaves moves
	// partitions within a PollInterval. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// InstanceID names this instance in the lease table. Defaults to
	// hostname-pid-random.
	InstanceID string
	// WatchInterval is how often an idle forwarder looks at the outbox's
	// high-water mark (the position of its id sequence: one cheap
	// query), reading the outbox only when it moved. This finds new rows
	// within a few milliseconds of their commit without NOTIFY. Unused
	// while notifications arrive. Defaults to DefaultWatchInterval; a
	// negative value turns watching off (the forwarder then reads every
	// PollInterval, or when notified).
	WatchInterval time.Duration
	// NotifyProbeInterval is how often a forwarder that listens for
	// notifications checks that they arrive, by notifying its own channel
	// through Config.DB; it also checks at start. When no notification
	// comes back within two seconds, or the listener fails, it logs an
	// error, reports ErrNotificationsLost (Hooks.OnError, Status), watches
	// the high-water mark as without notifications, and listens again
	// until a probe arrives. Defaults to DefaultNotifyProbeInterval; a
	// negative value turns probing off.
	NotifyProbeInterval time.Duration
}

func (p *Source) setDefaults() {
	p.PollInterval = cmp.Or(p.PollInterval, DefaultPollInterval)
	p.Partitions = cmp.Or(p.Partitions, DefaultPartitions)
	p.LeaseTTL = cmp.Or(p.LeaseTTL, DefaultLeaseTTL)
	if p.InstanceID == "" {
		host, _ := os.Hostname()
		p.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), watermill.NewShortUUID())
	}
	p.WatchInterval = cmp.Or(p.WatchInterval, DefaultWatchInterval)
	p.NotifyProbeInterval = cmp.Or(p.NotifyProbeInterval, DefaultNotifyProbeInterval)
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first.
func (p Source) Validate() error {
	p.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{sqladapters.ErrInvalidConfig}, args...)...)
	}
	switch {
	case p.PollInterval < time.Millisecond:
		return bad("Polling.PollInterval must be at least 1ms, got %v", p.PollInterval)
	case p.Partitions < 1 || p.Partitions > 4096:
		return bad("Polling.Partitions must be between 1 and 4096, got %d", p.Partitions)
	case p.LeaseTTL < 300*time.Millisecond:
		return bad("Polling.LeaseTTL must be at least 300ms, got %v", p.LeaseTTL)
	case len(p.InstanceID) > 200:
		return bad("Polling.InstanceID must be at most 200 bytes")
	case p.WatchInterval > 0 && p.WatchInterval < time.Millisecond:
		return bad("Polling.WatchInterval must be at least 1ms (or negative to turn watching off), got %v", p.WatchInterval)
	case p.NotifyProbeInterval > 0 && p.NotifyProbeInterval < 10*time.Millisecond:
		return bad("Polling.NotifyProbeInterval must be at least 10ms (or negative to turn probing off), got %v", p.NotifyProbeInterval)
	}
	return nil
}

// Open returns the source a forwarder drives; forwarder.New calls it.
func (p Source) Open(env source.Env) (source.Source, error) {
	p.setDefaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	s := &poller{
		cfg:      p,
		env:      env,
		inflight: map[int64]struct{}{},
		wakeCh:   make(chan struct{}, 1),
		fastCh:   make(chan struct{}, 1),
		fastIdx:  len(fastPolls),
	}
	s.readRetry.Policy = retry.Operations
	if env.ExactlyOnce {
		s.acquired, s.acquireCh = map[int]bool{}, make(chan struct{}, 1)
	}
	s.floor.on, s.floor.holds = env.Dialect.Features().Horizon, env.DeadLetterHolds
	if l, ok := env.DB.(sqladapters.Listener); ok && env.Dialect.NotifyChannel() != "" {
		s.listener, s.channel = l, env.Dialect.NotifyChannel()
	}
	s.watchWanted.Store(s.listener == nil)
	return s, nil
}

// poller is the polling source. Its reads, floor and in-flight ids are
// the engine loop's (Step, the callbacks and what it passes to Do); the
// lease keeper (leases.go), the listener (listen.go), the high-water-mark
// watcher and the maintenance run on goroutines of their own.
type poller struct {
	cfg      Source
	env      source.Env
	e        source.Engine
	ctx      context.Context // Run's: the reads end with it
	listener sqladapters.Listener
	channel  string

	// lease state, guarded by leaseMu
	leaseMu       sync.Mutex
	owned         []int
	leaseDeadline time.Time
	short         atomic.Bool // holding fewer partitions than the fair share
	// acquired holds, in exactly-once mode, the owned partitions the
	// engine acquired: only they are read (see acquire.go).
	acquired  map[int]bool
	acquireCh chan struct{}

	// the loop's
	inflight  map[int64]struct{} // read and not yet completed or left
	reading   bool
	dirty     bool            // a read is due
	hadRoom   bool            // the engine had room at the last step
	afterRead []func()        // work waiting for the read in flight to end
	blocked   map[string]bool // keys left during the read in flight
	prevFull  bool
	readRetry retry.Backoff // paces reads after a failed one
	readOwned []int         // the partitions of the last read (nil: all)
	readOnce  bool          // a read was started
	floor     floorState
	pollTimer *time.Timer
	pollGen   int
	fastIdx   int

	// wakeups from other goroutines, coalesced
	wakeCh  chan struct{} // a read is due (a notification, new leases)
	fastCh  chan struct{} // a read is due now and shortly after (the mark moved)
	localCh <-chan struct{}

	mismatchLogged time.Time // the lease loop's: when a settings mismatch was last logged

	// the high-water-mark watcher: it looks while watchWanted (no
	// listener, or notifications lost) and the loop says a look could lead
	// to a read (watchOK: no read due or running, the engine has room).
	watchWanted atomic.Bool
	watchOK     atomic.Bool
}

// fastPolls follow an in-process wakeup: the publisher pings before its
// transaction commits, so look again a few times shortly after.
var fastPolls = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}

// Prepare implements source.Source: the lease rows exist and agree with
// Partitions.
func (p *poller) Prepare(ctx context.Context) error {
	if p.env.Owner != nil {
		return nil // the outbox is held elsewhere: no leases here
	}
	d, db := p.env.Dialect, p.env.DB
	if err := d.EnsurePartitions(ctx, db, p.cfg.Partitions); err != nil {
		return fmt.Errorf("millbox: forwarder start: %w", err)
	}
	n, err := d.CountPartitions(ctx, db)
	if err != nil {
		return fmt.Errorf("millbox: forwarder start: %w", err)
	}
	if n != p.cfg.Partitions {
		return fmt.Errorf("%w: Polling.Partitions is %d but the outbox %s is split into %d partitions; "+
			"every forwarder of one outbox must use the same value (to change it, stop them all and delete the rows of the _leases table)",
			sqladapters.ErrInvalidConfig, p.cfg.Partitions, d.OutboxTable(), n)
	}
	if err := d.HeartbeatSettings(ctx, db, p.cfg.InstanceID, p.cfg.LeaseTTL, p.env.Settings); err != nil {
		var mismatch *sqladapters.SettingMismatchError
		if errors.As(err, &mismatch) {
			// Refuse, and leave no member row that would make the live
			// instances count this one.
			_ = d.RemoveMember(context.WithoutCancel(ctx), db, p.cfg.InstanceID)
		}
		return fmt.Errorf("millbox: forwarder start: %w", err)
	}
	return nil
}

// Start implements source.Source.
func (p *poller) Start(ctx context.Context, e source.Engine) (wait func()) {
	p.e, p.ctx = e, ctx
	p.dirty = true
	p.schedule(p.cfg.PollInterval)
	var local func()
	p.localCh, local = wake.SubscribeRows(p.env.Dialect.OutboxTable())

	var wg sync.WaitGroup
	listening := make(chan struct{})
	if p.listener != nil {
		wg.Go(func() { p.listenLoop(ctx, listening) })
	} else {
		close(listening)
	}
	if m, ok := p.env.Dialect.(sqladapters.Maintainer); ok && m.MaintainEvery() > 0 {
		wg.Go(func() { p.maintainLoop(ctx, m) })
	}
	leaseReady := make(chan struct{})
	if p.env.Owner != nil {
		wg.Go(func() { p.ownerLoop(ctx, leaseReady) })
	} else {
		wg.Go(func() { p.leaseLoop(ctx, leaseReady) })
	}
	acquired := make(chan struct{})
	if p.env.ExactlyOnce {
		wg.Go(func() { p.acquireLoop(ctx, acquired) })
	} else {
		close(acquired)
	}
	wg.Go(func() { p.watchLoop(ctx) })
	wg.Go(func() { p.wakeLoop(ctx) })
	wg.Go(func() {
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
		select {
		case <-acquired: // the first claims are done, or failed
		case <-ctx.Done():
			return
		}
		e.Started()
	})
	return func() {
		wg.Wait()
		local()
		p.pollTimer.Stop()
	}
}

// Close implements source.Source: it releases every partition and the
// member row, so other instances take over without waiting for the
// leases to expire.
func (p *poller) Close() { p.leave() }

// wake makes a read due; any goroutine.
func (p *poller) wake() {
	select {
	case p.wakeCh <- struct{}{}:
	default:
	}
}

// wakeFast makes a read due now and shortly after; any goroutine.
func (p *poller) wakeFast() {
	select {
	case p.fastCh <- struct{}{}:
	default:
	}
}

// wakeLoop hands wakeups to the loop, one at a time.
func (p *poller) wakeLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wakeCh:
			p.e.Do(func() { p.dirty = true })
		case <-p.fastCh:
			p.e.Do(p.fast)
		case <-p.localCh:
			p.e.Do(p.fast)
		case <-p.env.Wake:
			p.e.Do(p.fast)
		}
	}
}

// fast makes a read due and looks again shortly after, a few times: the
// mark moves, and an in-process publisher pings, before the writing
// transaction commits.
func (p *poller) fast() {
	p.dirty = true
	p.fastIdx = 0
	p.schedule(fastPolls[0])
}

// schedule sets the poll timer to make a read due after wait.
func (p *poller) schedule(wait time.Duration) {
	if p.pollTimer != nil {
		p.pollTimer.Stop()
	}
	p.pollGen++
	gen := p.pollGen
	p.pollTimer = time.AfterFunc(wait, func() {
		p.e.Do(func() {
			if gen == p.pollGen {
				p.onPollTimer()
			}
		})
	})
}

func (p *poller) onPollTimer() {
	p.dirty = true
	wait := p.cfg.PollInterval
	if p.fastIdx < len(fastPolls)-1 {
		p.fastIdx++
		wait = fastPolls[p.fastIdx]
	} else {
		p.fastIdx = len(fastPolls)
	}
	p.schedule(wait)
}

// Step implements source.Source: it pauses the engine while the leases
// are not valid, and starts a read when one is due and granted.
func (p *poller) Step() {
	p.e.SetPaused(!p.leaseValid()) // the leases ran out: another instance may own these keys now
	room := p.e.Room()
	if room && !p.hadRoom {
		p.dirty = true // the engine has room again (the destination is back, a pause ended)
	}
	p.hadRoom = room
	p.maybeRead()
	p.watchOK.Store(!p.reading && !p.dirty && room)
}

// Busy implements source.Source.
func (p *poller) Busy() bool { return p.reading }

// Feed implements source.Source: the polling source only reads.
func (p *poller) Feed() <-chan func() { return nil }

// Delivered implements source.Source.
func (p *poller) Delivered([]*source.Row) {}

// Completed implements source.Source: the rows are gone from the outbox,
// so they need no excluding from reads any more.
func (p *poller) Completed(rows []*source.Row) {
	p.later(func() {
		for _, r := range rows {
			delete(p.inflight, r.ID)
		}
	})
}

// Left implements source.Source: the rows are pending again, below the
// floor perhaps. A read in flight may have started before the change that
// makes the database hold these rows' keys back (a recorded failure), so
// its rows of these keys are not taken, and the rows stay excluded until
// it has ended.
func (p *poller) Left(rows []*source.Row) {
	for _, r := range rows {
		p.floor.handedBack(r.ID)
		if p.reading && r.Keyed {
			if p.blocked == nil {
				p.blocked = map[string]bool{}
			}
			p.blocked[r.Key] = true
		}
	}
	p.later(func() {
		for _, r := range rows {
			delete(p.inflight, r.ID)
		}
	})
}

// later runs fn now, or after the read in flight, whose snapshot may
// predate what fn relies on.
func (p *poller) later(fn func()) {
	if p.reading {
		p.afterRead = append(p.afterRead, fn)
		return
	}
	fn()
}

// maybeRead starts a read when one is due, the leases are valid and the
// engine grants it.
func (p *poller) maybeRead() {
	if p.reading || !p.dirty {
		return
	}
	owned, ok := p.currentOwned()
	if !ok || !p.e.Grant() {
		return
	}
	p.dirty = false
	p.reading = true
	exclude := make([]int64, 0, len(p.inflight))
	for id := range p.inflight {
		exclude = append(exclude, id)
	}
	q := sqladapters.PendingQuery{Partitions: p.cfg.Partitions, Owned: owned, Limit: p.env.BatchSize, Exclude: exclude, DeadLetterHolds: p.env.DeadLetterHolds}
	head, after := p.floor.next(owned, time.Now(), p.cfg.PollInterval)
	q.After = after
	if !head {
		// A head read sees the held keys' rows, so that the floor stays
		// below them.
		q.SkipKeys = p.e.HeldKeys()
	}
	// The first read of these partitions may meet a backlog as well as a
	// read after a full one: on Postgres, a read of some of the
	// partitions on a large table is JIT-compiled without the backlog
	// settings (the planner cannot estimate key_hash % Partitions),
	// which kept instances idle for seconds at start.
	backlog := p.prevFull || !p.readOnce || !slices.Equal(owned, p.readOwned)
	p.readOnce, p.readOwned = true, owned
	ctx := p.ctx
	go func() {
		res := p.read(ctx, q, backlog, head)
		p.e.Do(func() { p.onRead(res) })
	}()
}

// readResult is the outcome of one read of the outbox.
type readResult struct {
	rows   []sqladapters.OutboxRow
	readAt time.Time // when the read started: row ages count from it
	full   bool      // the read hit its limit: more rows are likely due
	err    error

	head          bool                // a head read (see horizon.go)
	before, after sqladapters.Horizon // looked at around a head read
	lookErr       error               // a look failed; the floor stays
}

// read returns up to q.Limit due rows. backlog tells the dialect that the
// last read was full (see sqladapters.Dialect.ReadPending). A head read
// looks at the horizon before and after; if a look fails, it reads all
// the same and the floor stays.
func (p *poller) read(ctx context.Context, q sqladapters.PendingQuery, backlog, head bool) readResult {
	d, db := p.env.Dialect, p.env.DB
	var res readResult
	if head {
		res.head = true
		res.before, res.lookErr = d.PendingHorizon(ctx, db)
	}
	res.readAt = time.Now()
	rows, err := d.ReadPending(ctx, db, q, backlog)
	if err != nil {
		return readResult{err: fmt.Errorf("millbox: read outbox: %w", err)}
	}
	res.rows, res.full = rows, len(rows) >= q.Limit
	if head && res.lookErr == nil {
		res.after, res.lookErr = d.PendingHorizon(ctx, db)
	}
	return res
}

func (p *poller) onRead(res readResult) {
	p.reading = false
	defer func() {
		fns := p.afterRead
		p.afterRead, p.blocked = nil, nil
		for _, fn := range fns {
			fn()
		}
	}()
	if res.err != nil {
		if p.ctx.Err() == nil {
			wait := p.readRetry.Next(res.err)
			p.env.ReportError(res.err)
			p.env.Database(res.err)
			p.env.Logger.Error("millbox forwarder: read failed; retrying", res.err, watermill.LogFields{"retry_in": wait.String()})
			p.schedule(wait)
		}
		return
	}
	p.env.Read(len(res.rows))
	p.env.Database(nil) // also clears what a failed look of the watch noted
	p.readRetry.Reset()
	p.prevFull = res.full
	if res.head {
		p.onLook(res)
	}
	if res.full {
		p.dirty = true
	}
	rows := make([]*source.Row, 0, len(res.rows))
	for _, r := range res.rows {
		if _, ok := p.inflight[r.ID]; ok || (r.Key != "" && p.blocked[r.Key]) {
			continue
		}
		row := &source.Row{OutboxRow: r, Keyed: r.Key != "", Partition: partitionOf(r.KeyHash, p.cfg.Partitions)}
		if r.Age > 0 {
			row.Created = res.readAt.Add(-r.Age)
		}
		rows = append(rows, row)
	}
	for _, r := range rows {
		p.inflight[r.ID] = struct{}{}
	}
	for _, r := range p.e.Add(rows) {
		delete(p.inflight, r.ID) // stays in the table, held back
	}
}

// onLook sets the floor from a head read, or says why it cannot: once
// and then every ten minutes, as an Info message (reads from the first row
// work, only slower on a large table). A dialect that cannot tell at all
// turns the floor off.
func (p *poller) onLook(res readResult) {
	if res.lookErr == nil {
		p.floor.headRead(res.before, res.rows, res.after)
		return
	}
	if p.ctx.Err() != nil {
		return
	}
	if errors.Is(res.lookErr, errors.ErrUnsupported) {
		p.floor.on = false // next then starts every read at the first row
		p.env.Logger.Info("millbox forwarder: reads start at the first row", watermill.LogFields{"reason": res.lookErr.Error()})
		return
	}
	if time.Since(p.floor.lookErrLogged) > 10*time.Minute {
		p.floor.lookErrLogged = time.Now()
		p.env.Logger.Info("millbox forwarder: cannot look at the outbox's horizon; reads start at the first row meanwhile", watermill.LogFields{"error": res.lookErr.Error()})
	}
}

// watchLoop looks at the outbox's high-water mark every WatchInterval
// while watching is wanted and could lead to a read, and makes a read due
// (with the quick follow-ups of an in-process wakeup) when it moved. A
// failed look counts as no change: the reads report an unreachable
// database.
func (p *poller) watchLoop(ctx context.Context) {
	if !p.env.Dialect.Features().HighWaterMark || p.cfg.WatchInterval <= 0 {
		return
	}
	last := int64(-1)
	wait := p.cfg.WatchInterval
	backoff := retry.Backoff{Policy: retry.Operations}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !p.watchWanted.Load() || !p.watchOK.Load() {
			t.Reset(p.cfg.WatchInterval)
			continue
		}
		mark, err := p.env.Dialect.HighWaterMark(ctx, p.env.DB)
		if err != nil && ctx.Err() == nil {
			p.env.Database(err)
		}
		switch {
		case err != nil:
			wait = min(backoff.Next(err), p.cfg.PollInterval)
		case mark != last:
			backoff.Reset()
			last = mark
			p.wakeFast()
			fallthrough
		default:
			backoff.Reset()
			wait = p.cfg.WatchInterval
		}
		t.Reset(wait)
	}
}

// maintainLoop runs the dialect's table maintenance (creating partitions
// ahead, dropping old ones) at start and every MaintainEvery. Failures are
// logged and retried at the next turn: maintenance is never urgent, and
// several instances running it at once is safe.
func (p *poller) maintainLoop(ctx context.Context, m sqladapters.Maintainer) {
	for {
		if err := m.Maintain(ctx, p.env.DB); err != nil && ctx.Err() == nil {
			p.env.ReportError(err)
			p.env.Logger.Error("millbox forwarder: outbox maintenance failed; trying again later", err,
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

// partitionOf places a row by its key_hash, as the reads do.
func partitionOf(hash int32, partitions int) int {
	return (int(hash)%partitions + partitions) % partitions
}
