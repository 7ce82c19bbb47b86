package forwarder

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/sqladapters"
)

// lane holds the rows of one ordering key that this instance has read and
// not yet published, in id order. A lane runs at most one Publish call at
// a time, so a key's messages reach the destination in order; lanes are
// independent of each other, so a slow, hanging or failing key holds back
// only its own rows.
type lane struct {
	key   string
	queue []pendingRow

	running   bool // a call is in flight (also after it timed out)
	hung      bool // the running call passed PublishTimeout
	recording bool // a failed attempt is being recorded
	holding   bool // recording failed: waiting before the rows are read again
	failed    bool // a failure was recorded: the lane is dropped once idle
	dropped   bool // forgotten, or about to be once the read in flight ends
	ready     bool // in the dispatcher's ready list
	single    int  // next calls carry one row each, to find which one fails
}

// pendingRow is a row read from the outbox, with its creation time on the
// local clock (from its age when read) for commit-to-ack latency.
type pendingRow struct {
	sqladapters.OutboxRow
	created time.Time
}

// dispatcher owns all in-flight state of a running forwarder: the rows
// read and not yet deleted, the lanes, the breaker, and when to read. It
// runs on one goroutine; reads, calls, failure records and deletes run on
// their own goroutines and report back through channels, so nothing here
// is shared or locked.
type dispatcher struct {
	f   *Forwarder
	ctx context.Context

	inflight map[int64]struct{} // read and not yet deleted or given up
	lanes    map[string]*lane
	readyq   []*lane
	buffered int // rows in lanes
	active   int // calls running that have not timed out

	recording int // failure records in flight
	deleting  int // ids with the deleter
	del       *deleter

	reading   bool
	dirty     bool     // a read is due
	progress  bool     // a call finished since the last read started
	afterRead []func() // releases waiting for the read in flight to end
	prevFull  bool
	errDelay  time.Duration
	floor     floorState

	breaker breaker

	stopping   bool
	release    *releaseReq
	quietSent  bool
	leaseValid bool

	calls    chan callEvent
	reads    chan readResult
	records  chan recordEvent
	acked    chan ackedBatch
	holds    chan *lane
	releases chan *releaseReq

	poll    *time.Timer
	fastIdx int
	probe   *time.Timer

	// watch: the outbox's high-water mark, looked at every WatchInterval
	// when nothing notifies this forwarder of new rows.
	watch    *time.Timer
	watching bool
	hwm      int64
	marks    chan watchMark

	lastErrLog time.Time
}

// releaseReq asks the dispatcher to go quiet so that partitions can be
// given back: no read, call, failure record or delete in flight. The
// lease keeper closes done once the partitions are released.
type releaseReq struct {
	quiet chan struct{}
	done  chan struct{}
}

// fastPolls follow an in-process wakeup: the publisher pings before its
// transaction commits, so look again a few times shortly after.
var fastPolls = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}

func newDispatcher(f *Forwarder, ctx context.Context) *dispatcher {
	d := &dispatcher{
		f:        f,
		ctx:      ctx,
		inflight: map[int64]struct{}{},
		lanes:    map[string]*lane{},
		calls:    make(chan callEvent, 64),
		reads:    make(chan readResult, 1),
		records:  make(chan recordEvent, 64),
		acked:    make(chan ackedBatch, 16),
		holds:    make(chan *lane, 16),
		releases: make(chan *releaseReq),
		dirty:    true,
		progress: true,
		fastIdx:  len(fastPolls),
		poll:     time.NewTimer(f.cfg.PollInterval),
		probe:    time.NewTimer(time.Hour),
	}
	d.probe.Stop()
	d.floor.on = f.cfg.Dialect.Features().Horizon
	d.del = newDeleter(f, d.acked)
	d.marks = make(chan watchMark, 1)
	d.watch = time.NewTimer(time.Hour)
	d.watch.Stop()
	if f.cfg.Dialect.Features().HighWaterMark && f.listener == nil && f.cfg.WatchInterval > 0 {
		d.hwm = -1
		d.watch.Reset(f.cfg.WatchInterval)
	}
	return d
}

// loop runs until Run's context ends and the calls, reads and failure
// records in flight have finished (calls that timed out are not waited
// for). The deleter is flushed by the caller.
func (d *dispatcher) loop() {
	done := d.ctx.Done()
	for {
		d.step()
		if d.stopping && d.active == 0 && d.recording == 0 && !d.reading {
			return
		}
		select {
		case <-done:
			done = nil
			d.stopping = true
			d.dropIdle()
		case ev := <-d.calls:
			d.onCall(ev)
		case res := <-d.reads:
			d.onRead(res)
		case ev := <-d.records:
			d.onRecord(ev)
		case b := <-d.acked:
			d.onAcked(b)
		case l := <-d.holds:
			l.holding = false
			d.settle(l)
		case req := <-d.releases:
			d.release, d.quietSent = req, false
			d.dropIdle()
		case <-d.releaseDone():
			d.release = nil
			d.dirty = true
		case <-d.f.wakeCh:
			d.dirty = true
		case <-d.f.localCh:
			d.dirty = true
			d.fastIdx = 0
			d.resetPoll(fastPolls[0])
		case <-d.poll.C:
			d.dirty = true
			wait := d.f.cfg.PollInterval
			if d.fastIdx < len(fastPolls)-1 {
				d.fastIdx++
				wait = fastPolls[d.fastIdx]
			} else {
				d.fastIdx = len(fastPolls)
			}
			d.poll.Reset(wait)
		case <-d.probe.C:
			d.sendProbe()
		case <-d.watch.C:
			d.look()
		case m := <-d.marks:
			d.watching = false
			if m.err == nil && m.mark != d.hwm {
				// The mark moves when a row is inserted, before its
				// transaction commits: look again shortly after too.
				d.hwm = m.mark
				d.dirty = true
				d.fastIdx = 0
				d.resetPoll(fastPolls[0])
			}
			d.watch.Reset(d.f.cfg.WatchInterval)
		}
	}
}

func (d *dispatcher) resetPoll(wait time.Duration) {
	d.poll.Stop()
	select {
	case <-d.poll.C:
	default:
	}
	d.poll.Reset(wait)
}

func (d *dispatcher) releaseDone() <-chan struct{} {
	if d.release == nil || !d.quietSent {
		return nil
	}
	return d.release.done
}

// step starts what can start: calls of ready lanes, a read, the answer to
// a release request.
func (d *dispatcher) step() {
	valid := d.f.leaseValid()
	if !valid && d.leaseValid {
		d.dropIdle() // the leases ran out: another instance may own these keys now
	}
	d.leaseValid = valid
	d.startCalls()
	d.maybeRead()
	if d.release != nil && !d.quietSent && !d.reading && d.active == 0 && d.recording == 0 && d.deleting == 0 {
		close(d.release.quiet)
		d.quietSent = true
	}
}

// paused tells whether no new call or read may start.
func (d *dispatcher) paused() bool {
	return d.stopping || d.release != nil || !d.leaseValid
}

func (d *dispatcher) startCalls() {
	if d.paused() || d.breaker.open {
		return
	}
	for d.active < d.f.cfg.Concurrency && len(d.readyq) > 0 {
		l := d.readyq[0]
		d.readyq[0] = nil
		d.readyq = d.readyq[1:]
		l.ready = false
		if l.running || l.recording || l.holding || l.failed || l.dropped || len(l.queue) == 0 {
			continue
		}
		d.start(l, false)
	}
	if len(d.readyq) == 0 {
		d.readyq = nil // let the backing array go
	}
}

// start sends the lane's next rows in one call: up to PublishBatch of
// them, or one while the lane looks for a failing row or when probing.
func (d *dispatcher) start(l *lane, probe bool) {
	n := min(len(l.queue), d.f.cfg.PublishBatch)
	if l.single > 0 || probe {
		n = 1
	}
	c := &call{lane: l, rows: l.queue[:n:n], probe: probe}
	l.running = true
	d.active++
	go d.f.runCall(c, d.calls)
}

func (d *dispatcher) onCall(ev callEvent) {
	c, l := ev.c, ev.c.lane
	switch ev.kind {
	case eventTimeout:
		// The call may still succeed; until it returns, the key must not
		// move. Count the attempt as failed and free its slot.
		d.active--
		d.progress = true
		l.hung = true
		d.f.reportError(ev.err)
		d.fail(l, c.rows[0], ev.err)
		return
	case eventDone:
		d.active--
	}
	d.progress = true
	l.running = false
	wasHung := l.hung
	l.hung = false
	if ev.delivered > 0 {
		ids := make([]int64, ev.delivered)
		for i, r := range c.rows[:ev.delivered] {
			ids[i] = r.ID
		}
		l.queue = l.queue[ev.delivered:]
		d.buffered -= ev.delivered
		d.deleting += len(ids)
		d.del.add(ids)
		if l.single > 0 {
			l.single = max(l.single-ev.delivered, 0)
		}
	}
	if d.f.cfg.Hooks.OnBatch != nil {
		st := BatchStats{Messages: len(c.rows), Forwarded: ev.delivered, Duration: ev.took}
		if ev.err != nil {
			st.Failed = len(c.rows) - ev.delivered
		}
		d.f.cfg.Hooks.OnBatch(st)
	}
	if wasHung {
		// Its failure was recorded when it timed out; the rows still
		// queued are read again once that failure's backoff is over.
		l.failed = true
		d.settle(l)
		return
	}
	if ev.err == nil {
		if ev.delivered > 0 {
			d.breaker.success()
			if c.probe {
				d.closeBreaker()
			}
		}
		d.settle(l)
		return
	}
	if failure.Unavailable(ev.err) || (d.breaker.open && !c.probe) {
		// Not the message's fault, or not known to be while the
		// destination looks down: keep the rows, pause everything
		// behind one probe.
		d.openBreaker(ev.err)
		if c.probe {
			d.scheduleProbe(true)
		}
		d.settle(l)
		return
	}
	if undelivered := len(c.rows) - ev.delivered; undelivered > 1 && !ev.partial && !failure.IsPermanent(ev.err) {
		// Several messages failed together: send them one by one to
		// find the one that fails.
		l.single = undelivered
		d.settle(l)
		return
	}
	if !c.probe && d.breaker.keyFailed(l.key) {
		// Several keys failed in a row: suspect the destination. This
		// lane waits for the probe instead of counting an attempt.
		d.openBreaker(ev.err)
		d.settle(l)
		return
	}
	if c.probe {
		d.scheduleProbe(false)
	}
	d.fail(l, l.queue[0], ev.err)
}

// fail records a failed attempt of row, the first undelivered row of l.
func (d *dispatcher) fail(l *lane, row pendingRow, cause error) {
	l.recording = true
	d.recording++
	go func() {
		dead, err := d.f.recordFailure(row.OutboxRow, cause)
		d.records <- recordEvent{lane: l, dead: dead, err: err}
	}()
}

func (d *dispatcher) onRecord(ev recordEvent) {
	l := ev.lane
	l.recording = false
	d.recording--
	if ev.err != nil {
		// The attempt is not stored, so the database does not hold the
		// key back: hold it here, then read its rows again.
		d.f.reportError(ev.err)
		if time.Since(d.lastErrLog) > 10*time.Second {
			d.lastErrLog = time.Now()
			d.f.cfg.Logger.Error("millbox forwarder: cannot record a failed attempt; holding the key and trying again later", ev.err,
				watermill.LogFields{"id": l.queue[0].ID, "uuid": l.queue[0].UUID})
		}
		l.holding = true
		time.AfterFunc(failure.Backoff(l.queue[0].Attempts+1, d.f.cfg.MinBackoff, d.f.cfg.MaxBackoff, d.f.cfg.BackoffJitter), func() { d.holds <- l })
	}
	l.failed = true
	d.settle(l)
}

// settle decides what happens to a lane after an event: another call, or
// forgetting it (its rows stay pending in the outbox and are read again).
func (d *dispatcher) settle(l *lane) {
	if l.running || l.recording || l.holding || l.dropped {
		return
	}
	if l.failed || d.paused() {
		d.drop(l)
		return
	}
	if len(l.queue) == 0 {
		d.forget(l)
		return
	}
	if !l.ready && !d.breaker.open {
		l.ready = true
		d.readyq = append(d.readyq, l)
	}
}

// drop forgets a lane and its rows. A read in flight may have started
// before the change that makes the database hold these rows back (a
// recorded failure), so the lane keeps rejecting rows of its key until
// that read has ended.
func (d *dispatcher) drop(l *lane) {
	l.dropped = true
	d.buffered -= len(l.queue)
	for _, r := range l.queue {
		d.floor.handedBack(r.ID)
	}
	rows := l.queue
	l.queue = nil
	d.later(func() {
		for _, r := range rows {
			delete(d.inflight, r.ID)
		}
		d.forget(l)
	})
}

func (d *dispatcher) forget(l *lane) {
	if d.lanes[l.key] == l {
		delete(d.lanes, l.key)
	}
}

// later runs fn now, or after the read in flight, whose snapshot may
// predate what fn relies on.
func (d *dispatcher) later(fn func()) {
	if d.reading {
		d.afterRead = append(d.afterRead, fn)
		return
	}
	fn()
}

// dropIdle drops every lane that is not busy: on stop, on release, when
// the leases ran out.
func (d *dispatcher) dropIdle() {
	for _, l := range d.lanes {
		if !l.running && !l.recording && !l.dropped {
			l.holding = false
			d.drop(l)
		}
	}
	d.readyq = nil
}

func (d *dispatcher) onAcked(b ackedBatch) {
	d.deleting -= len(b.ids)
	if b.kept > 0 {
		d.floor.handedBack(b.kept)
	}
	d.later(func() {
		for _, id := range b.ids {
			delete(d.inflight, id)
		}
	})
}

// maybeRead starts a read when one is due and there is room: the lanes
// hold less than a batch and the deleter is not far behind.
func (d *dispatcher) maybeRead() {
	if d.reading || !d.dirty || d.paused() || (d.breaker.open && !d.breaker.probeRead) {
		return
	}
	if !d.progress && d.active > 0 && !d.breaker.probeRead {
		// Every call since the last read is still out (a slow or
		// unreachable destination): more rows could not go out sooner,
		// and reading them would walk the rows held back, again and
		// again. The next call to finish allows a read.
		return
	}
	d.progress = false
	d.breaker.probeRead = false
	cfg := &d.f.cfg
	if d.buffered >= cfg.BatchSize || d.deleting >= 4*cfg.BatchSize {
		return
	}
	owned, ok := d.f.currentOwned()
	if !ok {
		return
	}
	d.dirty = false
	d.reading = true
	limit := cfg.BatchSize
	exclude := make([]int64, 0, len(d.inflight))
	for id := range d.inflight {
		exclude = append(exclude, id)
	}
	backlog := d.prevFull
	head, after := d.floor.next(owned, time.Now(), cfg.PollInterval)
	go func() {
		d.reads <- d.f.read(d.ctx, owned, exclude, limit, backlog, head, after)
	}()
}

func (d *dispatcher) onRead(res readResult) {
	d.reading = false
	if res.err == nil {
		d.f.tel.batchSize(d.ctx, len(res.rows))
		if hook := d.f.cfg.Hooks.OnRead; hook != nil {
			hook(len(res.rows))
		}
	}
	if res.err != nil {
		if d.ctx.Err() == nil {
			d.errDelay = min(max(2*d.errDelay, 100*time.Millisecond), 5*time.Second)
			d.f.reportError(res.err)
			d.f.cfg.Logger.Error("millbox forwarder: read failed; retrying", res.err, watermill.LogFields{"retry_in": d.errDelay.String()})
			d.resetPoll(d.errDelay)
		}
	} else {
		d.errDelay = 0
		d.prevFull = res.full
		if res.head {
			d.onLook(res)
		}
		if res.full {
			d.dirty = true
		}
		if !d.paused() {
			d.add(res.rows, res.readAt)
		}
	}
	fns := d.afterRead
	d.afterRead = nil
	for _, fn := range fns {
		fn()
	}
}

// onLook sets the floor from a head read, or says why it cannot: once
// and then every ten minutes, as an Info message (reads from the first row
// work, only slower on a large table). A dialect that cannot tell at all
// turns the floor off.
func (d *dispatcher) onLook(res readResult) {
	if res.lookErr == nil {
		d.floor.headRead(res.before, res.rows, res.after)
		return
	}
	if d.ctx.Err() != nil {
		return
	}
	if errors.Is(res.lookErr, errors.ErrUnsupported) {
		d.floor.on = false // next then starts every read at the first row
		d.f.cfg.Logger.Info("millbox forwarder: reads start at the first row", watermill.LogFields{"reason": res.lookErr.Error()})
		return
	}
	if time.Since(d.floor.lookErrLogged) > 10*time.Minute {
		d.floor.lookErrLogged = time.Now()
		d.f.cfg.Logger.Info("millbox forwarder: cannot look at the outbox's horizon; reads start at the first row meanwhile", watermill.LogFields{"error": res.lookErr.Error()})
	}
}

// add queues newly read rows on their lanes.
func (d *dispatcher) add(rows []sqladapters.OutboxRow, readAt time.Time) {
	for _, r := range rows {
		if _, ok := d.inflight[r.ID]; ok {
			continue
		}
		key := r.Key
		if key == "" {
			// No ordering key: a lane of its own. Keys never contain NUL.
			key = "\x00" + strconv.FormatInt(r.ID, 10)
		}
		l := d.lanes[key]
		if l == nil {
			l = &lane{key: key}
			d.lanes[key] = l
		} else if l.failed || l.dropped || l.hung || l.holding {
			continue // its key is held back: these rows wait for the retry
		}
		d.inflight[r.ID] = struct{}{}
		l.queue = append(l.queue, pendingRow{OutboxRow: r, created: readAt.Add(-r.Age)})
		d.buffered++
		d.settle(l)
	}
}

// look reads the outbox's high-water mark, unless a read is in flight or
// due anyway, or nothing may be read now. A changed mark makes a read due.
// A failure is left to the poll: it counts as no change.
func (d *dispatcher) look() {
	if d.watching {
		return
	}
	if d.reading || d.dirty || d.paused() || d.breaker.open {
		d.watch.Reset(d.f.cfg.WatchInterval)
		return
	}
	d.watching = true
	go func() {
		mark, err := d.f.cfg.Dialect.HighWaterMark(d.ctx, d.f.cfg.DB)
		d.marks <- watchMark{mark, err}
	}()
}

// watchMark is the outcome of one look at the high-water mark.
type watchMark struct {
	mark int64
	err  error
}
