package engine

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/completer"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/source"
)

// lane holds the rows of one ordering key (or one row without a key) that
// the engine has and has not published, in order. A lane runs at most one
// Publish call at a time, so a key's messages reach the destination in
// order; lanes are independent of each other, so a slow, hanging or
// failing key holds back only its own rows.
type lane struct {
	key   string // the lane's name: the ordering key, or NUL and the row id
	okey  string // the ordering key ("" without one)
	keyed bool
	part  int           // the partition of its rows
	queue []*source.Row // rows not in the call
	call  *call         // the call in flight, also after it timed out

	hung      bool // the call passed PublishTimeout and still runs
	recording bool // a failed attempt is being recorded
	holding   bool // recording failed: the key waits before its rows are read again
	failed    bool // a failure was recorded: the lane is given back once idle
	dropped   bool // given back
	ready     bool // in the ready list
	single    int  // the next calls carry one row each, to find the failing one
}

// blocked tells that the lane takes no new rows: they stay in the table
// until the lane is given back.
func (l *lane) blocked() bool { return l.hung || l.recording || l.holding || l.failed || l.dropped }

// Engine owns the in-flight state of a running forwarder: the lanes, the
// calls, the failure records, the breaker and the deletes. It runs on one
// goroutine (loop); calls, failure records and deletes run on their own
// goroutines and report back through channels, and the source's
// goroutines hand their results over through Do. It drives one source of
// rows (see package forwarder/internal/source) and implements
// source.Engine for it.
type Engine struct {
	cfg Config
	obs Observer
	src source.Source
	ctx context.Context

	lanes     map[string]*lane
	unkeyed   int // lanes of rows without a key
	readyq    []*lane
	buffered  int // rows queued on lanes
	active    int // calls running that have not timed out
	recording int // failure records in flight
	deleting  int // rows with the deleter
	del       *completer.Completer

	tx *txEngine // exactly-once mode; nil otherwise

	breaker  breaker
	progress bool      // a call ended since the source last took rows
	lastTook time.Time // when the source last took rows
	waitFrom time.Time // when the first call started after a call last ended; zero while none did
	gate     *time.Timer
	gateSet  bool // gate runs: the destination stopped answering
	paused   bool // by the source (its leases ran out)
	stopping bool
	quiesce  *quiesceReq
	quietOK  bool // quiesce.quiet is closed

	calls    chan callEvent
	records  chan recordEvent
	acked    chan completer.Batch
	do       chan func()
	quiesces chan *quiesceReq
	probe    *time.Timer
	quit     chan struct{} // closed when loop returns

	lastErrLog time.Time
}

// quiesceReq asks the engine to go quiet; the engine closes quiet once it
// is, and stays paused until the requester closes done.
type quiesceReq struct {
	quiet chan struct{}
	done  chan struct{}
}

// New returns an engine that drives src with cfg. It starts nothing: call
// Run.
func New(cfg Config, src source.Source) *Engine {
	e := &Engine{
		cfg:      cfg,
		obs:      cfg.Observer,
		src:      src,
		lanes:    map[string]*lane{},
		calls:    make(chan callEvent, 64),
		records:  make(chan recordEvent, 64),
		acked:    make(chan completer.Batch, 16),
		do:       make(chan func(), 256),
		quiesces: make(chan *quiesceReq),
		probe:    time.NewTimer(time.Hour),
		gate:     time.NewTimer(time.Hour),
		quit:     make(chan struct{}),
	}
	e.probe.Stop()
	e.gate.Stop()
	if cfg.Tx != nil {
		e.tx = newTxEngine(e, cfg.Tx)
	}
	return e
}

// Run starts the source and forwards until ctx ends and nothing is in
// flight any more; then the source's goroutines have ended, published rows
// are removed and, in exactly-once mode, the destination's partitions are
// let go. The caller closes the source.
func (e *Engine) Run(ctx context.Context) {
	e.ctx = ctx
	e.del = completer.Start(completer.Config{
		DB: e.cfg.DB, Dialect: e.cfg.Dialect, KeepForwarded: e.cfg.KeepForwarded, CloseTimeout: e.cfg.CloseTimeout,
		Logger: e.cfg.Logger, ReportError: e.obs.Error,
	}, e.acked, e.quit)
	wait := e.src.Start(ctx, e)
	e.loop()
	// Nothing is in flight any more: calls, failure records, deletes and
	// the source's reads have ended.
	wait()
	e.del.Close()
	if e.tx != nil {
		e.tx.close()
	}
}

// loop runs until Run's context has ended and nothing is in flight any
// more: no call (calls past PublishTimeout are not waited for), failure
// record, delete or read of the source.
func (e *Engine) loop() {
	defer close(e.quit)
	done := e.ctx.Done()
	for {
		e.step()
		if e.stopping && e.quiet() && e.quiesce == nil {
			return
		}
		var feed <-chan func()
		if e.room() {
			feed = e.src.Feed()
		}
		var txns <-chan txEvent
		if e.tx != nil {
			txns = e.tx.events
		}
		select {
		case <-done:
			done = nil
			e.stopping = true
			e.dropIdle()
		case ev := <-e.calls:
			e.onCall(ev)
		case ev := <-txns:
			e.tx.onTxn(ev)
		case ev := <-e.records:
			e.onRecord(ev)
		case b := <-e.acked:
			e.onAcked(b)
		case fn := <-e.do:
			fn()
		case fn := <-feed:
			e.took()
			fn()
		case req := <-e.quiesces:
			e.quiesce, e.quietOK = req, false
			e.dropIdle()
		case <-e.quiesceDone():
			e.quiesce = nil
		case <-e.probe.C:
			e.sendProbe()
		case <-e.gate.C:
			e.gateSet = false // the next step may take rows again
		}
	}
}

// step lets the source start what is due, starts the calls of ready lanes,
// and answers a quiesce request once nothing is in flight.
func (e *Engine) step() {
	e.src.Step()
	if e.startCalls() {
		// The calls took rows off the lanes: a read that waited for room
		// (the one after a full read) starts now, not at the next event,
		// which may be the end of a call as long as a read.
		e.src.Step()
	}
	if e.quiesce != nil && !e.quietOK && e.quiet() {
		close(e.quiesce.quiet)
		e.quietOK = true
	}
}

func (e *Engine) quiet() bool {
	return e.active == 0 && e.recording == 0 && e.deleting == 0 && !e.src.Busy()
}

func (e *Engine) quiesceDone() <-chan struct{} {
	if e.quiesce == nil || !e.quietOK {
		return nil
	}
	return e.quiesce.done
}

// halted tells whether no new call may start and no rows be taken.
func (e *Engine) halted() bool { return e.paused || e.stopping || e.quiesce != nil }

// room tells whether the engine takes more rows: not halted, the breaker
// closed (or one read allowed to find a row to probe with), the lanes
// holding less than a read's worth of rows, the deleter not far behind,
// and the destination answering (see answering).
func (e *Engine) room() bool {
	if e.halted() || (e.breaker.open && !e.breaker.probeRead) {
		return false
	}
	return e.buffered < e.cfg.BatchSize && e.deleting < 4*e.cfg.BatchSize && e.answering()
}

// answering tells whether the destination looks alive enough for more
// rows: no call is out, a call ended since the source last took rows, or
// every call started since a call last ended is younger than stallAfter
// (or there is none), or probeMax has passed since the source last took
// rows. While the calls started after the last answer hang (a broker away
// whose client waits for it instead of failing) the source takes rows
// once per probeMax at most: they would only wait behind those calls, and
// reading the outbox for them again and again would load the database for
// nothing. A call hanging alone does not count once a call that started
// after it ended: the destination answers the other keys, whose rows flow
// on.
func (e *Engine) answering() bool {
	if e.progress || e.active == 0 || e.breaker.probeRead || e.waitFrom.IsZero() || time.Since(e.waitFrom) < stallAfter {
		return true
	}
	wait := probeMax - time.Since(e.lastTook)
	if wait <= 0 {
		return true
	}
	if !e.gateSet {
		e.gateSet = true
		e.gate.Reset(wait)
	}
	return false
}

// stallAfter is how long calls may be out with none ending before the
// destination counts as not answering: far longer than a healthy broker's
// round trip between the ends of calls under load, short enough that a
// broker that went away is noticed before the outbox is read more than a
// few times.
const stallAfter = 20 * time.Millisecond

// took notes that the source takes rows now.
func (e *Engine) took() {
	e.breaker.probeRead = false
	e.progress = false
	e.lastTook = time.Now()
}

// Do implements source.Engine.
func (e *Engine) Do(fn func()) bool {
	select {
	case e.do <- fn:
		return true
	case <-e.quit:
		return false
	}
}

// Quiesce implements source.Engine.
func (e *Engine) Quiesce(ctx context.Context, fn func() error) error {
	req := &quiesceReq{quiet: make(chan struct{}), done: make(chan struct{})}
	defer close(req.done)
	select {
	case e.quiesces <- req:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.quit:
		return destination.ErrClosed
	}
	select {
	case <-req.quiet:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.quit:
		return destination.ErrClosed
	}
	return fn()
}

// Grant implements source.Engine.
func (e *Engine) Grant() bool {
	if !e.room() {
		return false
	}
	e.took()
	return true
}

// Room tells, without granting anything, whether a read would be granted.
func (e *Engine) Room() bool { return e.room() }

// Stopping implements source.Engine.
func (e *Engine) Stopping() bool { return e.stopping }

// Started implements source.Engine.
func (e *Engine) Started() { e.cfg.Started() }

// Acquire implements source.Engine.
func (e *Engine) Acquire(ctx context.Context, partitions []int) ([]int, error) {
	if e.tx == nil {
		return partitions, nil
	}
	return e.tx.acquire(ctx, partitions)
}

// Release implements source.Engine.
func (e *Engine) Release(partitions []int) {
	if e.tx != nil {
		e.Do(func() { e.tx.release(partitions) })
	}
}

// sync runs fn on the loop and waits for it; false when the engine
// stopped first.
func (e *Engine) sync(fn func()) bool {
	done := make(chan struct{})
	if !e.Do(func() { fn(); close(done) }) {
		return false
	}
	select {
	case <-done:
		return true
	case <-e.quit:
		return false
	}
}

// laneKey names the lane of r. Keys never contain NUL.
func laneKey(r *source.Row) string {
	if !r.Keyed {
		return "\x00" + strconv.FormatInt(r.ID, 10)
	}
	return r.Key
}

// Add implements source.Engine.
func (e *Engine) Add(rows []*source.Row) (rejected []*source.Row) {
	if e.halted() {
		return rows
	}
	for _, r := range rows {
		if e.tx != nil && !e.tx.takes(r) {
			rejected = append(rejected, r) // its partition is not acquired
			continue
		}
		key := laneKey(r)
		l := e.lanes[key]
		switch {
		case l == nil:
			l = &lane{key: key, okey: r.Key, keyed: r.Keyed, part: r.Partition}
			e.lanes[key] = l
			if !r.Keyed {
				e.unkeyed++
			}
		case l.blocked() || (e.tx != nil && l.part != r.Partition):
			rejected = append(rejected, r)
			continue
		}
		l.queue = append(l.queue, r)
		e.buffered++
		e.settle(l)
	}
	return rejected
}

// HeldKeys implements source.Engine.
func (e *Engine) HeldKeys() []string {
	var keys []string
	for _, l := range e.lanes {
		if l.keyed && (l.hung || l.holding) {
			keys = append(keys, l.okey)
		}
	}
	return keys
}

// Holds implements source.Engine.
func (e *Engine) Holds(key string, keyed bool) bool {
	if !keyed {
		return e.unkeyed > 0
	}
	return e.lanes[key] != nil
}

// Yield implements source.Engine.
func (e *Engine) Yield(key string) {
	l := e.lanes[key]
	if l == nil || len(l.queue) == 0 {
		return
	}
	rows := l.queue
	l.queue = nil
	l.single = 0
	e.buffered -= len(rows)
	e.src.Left(rows)
	e.settle(l)
}

// SetPaused implements source.Engine.
func (e *Engine) SetPaused(paused bool) {
	if paused == e.paused {
		return
	}
	e.paused = paused
	if paused {
		e.dropIdle()
	}
}

// startCalls starts the calls of ready lanes and tells whether it started
// any.
func (e *Engine) startCalls() bool {
	if e.tx != nil {
		e.tx.start()
		return false
	}
	if e.halted() || e.breaker.open {
		return false
	}
	started := false
	for e.active < e.cfg.Concurrency && len(e.readyq) > 0 {
		l := e.readyq[0]
		e.readyq[0] = nil
		e.readyq = e.readyq[1:]
		l.ready = false
		if l.call != nil || l.blocked() || len(l.queue) == 0 {
			continue
		}
		e.start(l, false)
		started = true
	}
	if len(e.readyq) == 0 {
		e.readyq = nil // let the backing array go
	}
	return started
}

// start sends the lane's next rows in one call: up to PublishBatch of
// them, or one while the lane looks for a failing row or when probing.
func (e *Engine) start(l *lane, probe bool) {
	n := min(len(l.queue), e.cfg.PublishBatch)
	if l.single > 0 || probe {
		n = 1
	}
	c := &call{lane: l, rows: l.queue[:n:n], probe: probe}
	l.queue = l.queue[n:]
	e.buffered -= n
	l.call = c
	e.callStarted()
	go e.runCall(c)
}

// callStarted counts a call (or transaction) that starts now.
func (e *Engine) callStarted() {
	if e.waitFrom.IsZero() {
		e.waitFrom = time.Now()
	}
	e.active++
}

// callEnded notes that a call (or transaction) ended, or passed
// PublishTimeout: the calls out now all started before it.
func (e *Engine) callEnded() {
	e.progress, e.waitFrom = true, time.Time{}
}

func (e *Engine) onCall(ev callEvent) {
	c, l := ev.c, ev.c.lane
	e.callEnded()
	if ev.kind == eventTimeout {
		// The call may still succeed; until it returns, the key must not
		// move. Free its slot, and count the attempt as failed unless the
		// destination is known to be down: a probe that hangs is a failed
		// probe, and the next one goes to another key.
		e.active--
		l.hung = true
		e.obs.Error(ev.err)
		if c.probe || e.breaker.open {
			if c.probe {
				e.scheduleProbe(true)
			}
			return
		}
		e.fail(l, c.rows[0], ev.err)
		return
	}
	if ev.kind == eventDone {
		e.active--
	}
	l.call = nil
	wasHung := l.hung
	l.hung = false
	if delivered := c.rows[:ev.delivered]; len(delivered) > 0 {
		e.src.Delivered(delivered)
		e.deleting += len(delivered)
		e.del.Add(delivered)
		if l.single > 0 {
			l.single = max(l.single-len(delivered), 0)
		}
	}
	if rest := c.rows[ev.delivered:]; len(rest) > 0 && !c.left {
		l.queue = append(slices.Clone(rest), l.queue...)
		e.buffered += len(rest)
	}
	if ev.kind != eventTx {
		st := Batch{Messages: len(c.rows), Forwarded: ev.delivered, Duration: ev.took}
		if ev.err != nil {
			st.Failed = len(c.rows) - ev.delivered
		}
		e.obs.Batch(st)
	}
	if wasHung {
		// Its failure was recorded (or is being recorded) when it timed
		// out; its key's rows are read again once that failure's backoff
		// is over.
		l.failed = true
		e.settle(l)
		return
	}
	if ev.err == nil {
		if ev.delivered > 0 {
			e.breaker.success()
			if c.probe {
				e.closeBreaker()
			}
		}
		e.settle(l)
		return
	}
	if failure.Unavailable(ev.err) || (e.breaker.open && !c.probe) {
		// Not the message's fault, or not known to be while the
		// destination looks down: keep the rows, pause everything
		// behind one probe.
		e.openBreaker(ev.err)
		if c.probe {
			e.scheduleProbe(true)
		}
		e.settle(l)
		return
	}
	if undelivered := len(c.rows) - ev.delivered; undelivered > 1 && !ev.partial && !failure.IsPermanent(ev.err) {
		// Several messages failed together: send them one by one to
		// find the one that fails.
		l.single = undelivered
		e.settle(l)
		return
	}
	if !c.probe && e.breaker.keyFailed(l.key) {
		// Several keys failed in a row: suspect the destination. This
		// lane waits for the probe instead of counting an attempt.
		e.openBreaker(ev.err)
		e.settle(l)
		return
	}
	if c.probe {
		e.scheduleProbe(false)
	}
	e.fail(l, l.queue[0], ev.err)
}

// fail records a failed attempt of row, the first undelivered row of l. A
// row in no table (Emitted) is written into the outbox through the
// source, which orders it before any later row of its key.
func (e *Engine) fail(l *lane, row *source.Row, cause error) {
	l.recording = true
	e.recording++
	if st, ok := e.src.(source.Storer); ok && row.Emitted {
		fail := e.failureOf(row, cause)
		emitted := *row
		go e.reportFailure(&emitted, fail, cause)
		st.StoreFailure(row, fail, func(id int64, err error) {
			e.onRecord(recordEvent{lane: l, row: row, dead: fail.Dead, err: err, id: id})
		})
		return
	}
	go func() {
		dead, err := e.recordFailure(row, cause)
		select {
		case e.records <- recordEvent{lane: l, row: row, dead: dead, err: err}:
		case <-e.quit:
		}
	}()
}

func (e *Engine) onRecord(ev recordEvent) {
	l := ev.lane
	l.recording = false
	e.recording--
	l.failed = true
	if ev.err == nil && ev.row.Emitted {
		// Written into the table: from now on a row like any other.
		ev.row.ID, ev.row.Emitted, ev.row.XID = ev.id, false, 0
	}
	if ev.err != nil {
		// The attempt is not stored, so the database does not hold the
		// key back: hold it here (HeldKeys), then let its rows be read
		// again.
		e.obs.Error(ev.err)
		e.logLimited("millbox forwarder: cannot record a failed attempt; holding the key and trying again later", ev.err,
			watermill.LogFields{"id": ev.row.ID, "uuid": ev.row.UUID})
		l.holding = true
		wait := e.cfg.Retry.NextRetry(ev.row.Attempts+1, ev.err)
		time.AfterFunc(wait, func() {
			e.Do(func() {
				l.holding = false
				e.settle(l)
			})
		})
	} else if l.call != nil && !l.call.left {
		// The hung call's rows are in the table with the failure on its
		// first row, which holds the key back there: they no longer
		// wait for the call.
		l.call.left = true
		e.src.Left(l.call.rows)
	}
	// The queued rows go back to the table now: the key is held back
	// there (or by HeldKeys), and read again once it may move.
	if rows := l.queue; len(rows) > 0 {
		l.queue = nil
		e.buffered -= len(rows)
		e.src.Left(rows)
	}
	e.settle(l)
}

// settle decides what happens to a lane after an event: another call, or
// giving it back (its rows stay pending in the outbox and are read again).
func (e *Engine) settle(l *lane) {
	if l.dropped || l.call != nil || l.recording || l.holding {
		return
	}
	if l.failed || e.halted() {
		e.drop(l)
		return
	}
	if len(l.queue) == 0 {
		e.forget(l)
		return
	}
	if !l.ready && !e.breaker.open {
		if e.tx != nil {
			e.tx.wait(l)
			return
		}
		l.ready = true
		e.readyq = append(e.readyq, l)
	}
}

// drop gives a lane and its queued rows back to the source.
func (e *Engine) drop(l *lane) {
	l.dropped = true
	rows := l.queue
	l.queue = nil
	e.buffered -= len(rows)
	e.forget(l)
	if len(rows) > 0 {
		e.src.Left(rows)
	}
}

func (e *Engine) forget(l *lane) {
	if e.lanes[l.key] == l {
		delete(e.lanes, l.key)
		if !l.keyed {
			e.unkeyed--
		}
	}
}

// dropIdle gives back every lane that is not busy: on stop, on a quiesce,
// on a pause.
func (e *Engine) dropIdle() {
	for _, l := range e.lanes {
		if l.call == nil && !l.recording {
			l.holding = false
			e.drop(l)
		}
	}
	e.clearReady()
}

// clearReady empties the ready list; the lanes on it are not ready any
// more.
func (e *Engine) clearReady() {
	for _, l := range e.readyq {
		l.ready = false
	}
	e.readyq = nil
	if e.tx != nil {
		e.tx.clearWaiting()
	}
}

func (e *Engine) onAcked(b completer.Batch) {
	e.deleting -= len(b.Done) + len(b.Left)
	if e.tx != nil {
		e.tx.onAcked(b)
	}
	if len(b.Done) > 0 {
		e.src.Completed(b.Done)
	}
	if len(b.Left) > 0 {
		e.src.Left(b.Left)
	}
}

// logLimited logs an error at most every ten seconds.
func (e *Engine) logLimited(msg string, err error, fields watermill.LogFields) {
	if time.Since(e.lastErrLog) > 10*time.Second {
		e.lastErrLog = time.Now()
		e.cfg.Logger.Error(msg, err, fields)
	}
}
