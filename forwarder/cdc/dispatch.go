package cdc

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/forwarder/internal/failure"
)

// unkeyed is the handed-key entry of the rows without an ordering key (a
// real key never contains NUL).
const unkeyed = "\x00"

// txn is a committed transaction of the stream whose rows are not all
// done. A row is done once it is deleted (or stamped) after the
// destination acknowledged it, or once it is left in the table to the
// polling path. The slot is confirmed up to the end of the last
// transaction of a done prefix.
type txn struct {
	end    pglogrepl.LSN
	commit time.Time
	xid    uint32
	left   int
}

// lane holds the rows of one ordering key (or one unkeyed row) waiting to
// be published, in order. One call at a time per lane.
type lane struct {
	key       string // lane key: the ordering key, or NUL and the id
	hkey      string // its entry among handed keys
	queue     []*streamRow
	call      []*streamRow // rows of the call in flight
	running   bool
	hung      bool // the call in flight passed PublishTimeout
	recording bool // a failed attempt is being recorded
	paused    bool // waiting for the destination to come back, or to record again
	ready     bool
	single    int // next calls carry one row each, to find the failing one
	failRow   *streamRow
	failErr   error
}

// handedKey is a key whose rows the polling path publishes.
type handedKey struct {
	// unresolved holds the transaction ids of rows the stream left in the
	// table for this key and that no read has been shown to see yet.
	unresolved []uint32
	// cand: a read at candLSN found no row of the key, the lane idle and
	// every unresolved row visible to it. The key goes back to the stream
	// once the stream has passed candLSN, if nothing happened to it since.
	cand    bool
	candLSN pglogrepl.LSN
}

// snapshotMark is where and when a read of the table saw it.
type snapshotMark struct {
	lsn  pglogrepl.LSN
	xmin uint32 // every transaction id before it had ended
}

// precedes compares 32-bit transaction ids modulo wraparound.
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

type callResult struct {
	l         *lane
	timeout   bool // the call passed PublishTimeout and still runs
	late      bool // the call returned after timing out
	delivered int
	partial   bool
	err       error
}

type recordResult struct {
	l    *lane
	row  *streamRow
	dead bool
	err  error
}

type deleteResult struct {
	rows  []*streamRow
	retry []*streamRow // not visible yet
	err   error
}

type pollResult struct {
	mark snapshotMark
	rows []polledRow
	full bool
	err  error
}

type polledRow struct {
	*streamRow
	due  bool
	wait time.Duration // until the row is due
}

type lookupResult struct {
	found bool
	key   string
	keyed bool
	xid   uint32
}

// dispatcher owns the state of one active session: lanes, stream
// transactions, handed keys, deletes. It runs on one goroutine; calls,
// reads, deletes and failure records run on their own and report back.
type dispatcher struct {
	f   *Forwarder
	cfg *Config
	ctx context.Context

	events <-chan streamEvent
	start  snapshotMark

	lanes    map[string]*lane
	readyq   []*lane
	active   int
	inflight map[int64]struct{}
	unkeyedL int // lanes of unkeyed rows

	txns      []*txn
	confirmed pglogrepl.LSN
	processed pglogrepl.LSN

	handed map[string]*handedKey
	cands  []string

	recording int
	lookups   int

	delQ     []*streamRow
	deleting int
	delWait  bool
	delDelay time.Duration

	polling   bool
	afterPoll []*streamRow   // completed while a read was in flight
	held      map[int64]bool // failed rows among them: their keys wait
	pollDue   bool
	pollTimer *time.Timer
	pollRows  int
	pollDelay time.Duration
	errDelay  time.Duration

	stopping bool
	streamOK bool
	abort    context.CancelFunc // ends the session
	abortErr error

	calls   chan callResult
	records chan recordResult
	deleted chan deleteResult
	polls   chan pollResult
	resumes chan *lane
	founds  chan lookupResult
	delKick chan struct{}
	// quit is closed when loop returns. Calls that passed PublishTimeout
	// may still be running then; their results are dropped.
	quit chan struct{}
}

func newDispatcher(f *Forwarder, ctx context.Context, abort context.CancelFunc, events <-chan streamEvent, start snapshotMark, confirmed pglogrepl.LSN, keys []lookupResult) *dispatcher {
	d := &dispatcher{
		f: f, cfg: &f.cfg, ctx: ctx, abort: abort, events: events, start: start,
		lanes: map[string]*lane{}, inflight: map[int64]struct{}{}, handed: map[string]*handedKey{},
		confirmed: confirmed, processed: confirmed, streamOK: true,
		calls: make(chan callResult, 64), records: make(chan recordResult, 16), deleted: make(chan deleteResult, 4),
		polls: make(chan pollResult, 1), resumes: make(chan *lane, 16), founds: make(chan lookupResult, 4),
		delKick:   make(chan struct{}, 1),
		quit:      make(chan struct{}),
		pollTimer: time.NewTimer(0),
	}
	for _, k := range keys {
		d.handed[hkeyOf(k.key, k.keyed)] = &handedKey{}
	}
	return d
}

func hkeyOf(key string, keyed bool) string {
	if keyed {
		return key
	}
	return unkeyed
}

// loop runs until ctx ends or the stream stops, then finishes the calls,
// failure records and deletes in flight (deletes within CloseTimeout).
func (d *dispatcher) loop() {
	defer close(d.quit)
	done := d.ctx.Done()
	for {
		d.startCalls()
		d.startDeletes()
		d.maybePoll()
		if d.stopping && d.active == 0 && d.recording == 0 && !d.polling && d.lookups == 0 {
			break
		}
		var events <-chan streamEvent
		if !d.stopping && d.streamOK && len(d.inflight) < d.cfg.MaxInflight {
			events = d.events
		}
		select {
		case <-done:
			done = nil
			d.stop()
		case ev, ok := <-events:
			if !ok {
				d.streamOK = false
				d.stop()
				continue
			}
			d.onStream(ev)
		case r := <-d.calls:
			d.onCall(r)
		case r := <-d.records:
			d.onRecord(r)
		case r := <-d.deleted:
			d.onDeleted(r)
		case r := <-d.polls:
			d.onPoll(r)
		case l := <-d.resumes:
			d.onResume(l)
		case r := <-d.founds:
			d.lookups--
			if r.found {
				d.hand(hkeyOf(r.key, r.keyed), r.xid)
			}
		case <-d.delKick:
			d.delWait = false
		case <-d.pollTimer.C:
			d.pollDue = true
		}
	}
	d.pollTimer.Stop()
	d.flushDeletes()
}

// stop lets the calls in flight finish and starts nothing new.
func (d *dispatcher) stop() {
	d.stopping = true
	for _, l := range d.lanes {
		l.queue = nil
	}
	d.readyq = nil
}

// flushDeletes waits for the published rows to be deleted, within
// CloseTimeout: a row left pending would be published again by the next
// session.
func (d *dispatcher) flushDeletes() {
	if d.abortErr != nil {
		return // the server is going away: release the slot at once
	}
	deadline := time.NewTimer(d.cfg.CloseTimeout)
	defer deadline.Stop()
	for len(d.delQ) > 0 || d.deleting > 0 {
		d.delWait = false
		d.startDeletes()
		select {
		case r := <-d.deleted:
			d.onDeleted(r)
		case <-d.delKick:
		case <-deadline.C:
			return
		}
	}
}

// onStream routes a committed transaction's rows and requeues, then moves
// the processed position.
func (d *dispatcher) onStream(ev streamEvent) {
	tx := &txn{end: ev.end, commit: ev.commit, xid: ev.xid, left: len(ev.rows)}
	d.txns = append(d.txns, tx)
	for _, r := range ev.rows {
		r.tx = tx
		d.route(r)
	}
	for _, rq := range ev.requeues {
		if rq.keyUnknown {
			d.lookup(rq.id, ev.xid)
			continue
		}
		d.hand(hkeyOf(rq.key, rq.keyed), ev.xid)
	}
	d.processed = max(d.processed, ev.end)
	d.checkCands()
	d.advance()
}

func (d *dispatcher) route(r *streamRow) {
	hk := hkeyOf(r.Key, r.keyed)
	if h := d.handed[hk]; h != nil {
		// Left in the table: the polling path publishes it.
		h.unresolved = append(h.unresolved, r.tx.xid)
		h.cand = false
		d.rowDone(r)
		return
	}
	if _, ok := d.inflight[r.ID]; ok {
		d.rowDone(r)
		return
	}
	if d.start.lsn != 0 && r.tx.end <= d.start.lsn && precedes(r.tx.xid, d.start.xmin) {
		// Committed before this session's first read of the table, which
		// found no pending row of its key: published before.
		d.rowDone(r)
		return
	}
	d.enqueue(r)
}

func (d *dispatcher) enqueue(r *streamRow) {
	key := r.Key
	if !r.keyed {
		key = unkeyed + strconv.FormatInt(r.ID, 10)
	}
	l := d.lanes[key]
	if l == nil {
		l = &lane{key: key, hkey: hkeyOf(r.Key, r.keyed)}
		d.lanes[key] = l
		if !r.keyed {
			d.unkeyedL++
		}
	}
	d.inflight[r.ID] = struct{}{}
	if r.tx == nil {
		d.pollRows++
	}
	l.queue = append(l.queue, r)
	d.settle(l)
}

// hand gives key hk to the polling path: its queued rows are left in the
// table, and rows of it arriving from the stream will be too.
func (d *dispatcher) hand(hk string, xid uint32) *handedKey {
	h := d.handed[hk]
	if h == nil {
		h = &handedKey{}
		d.handed[hk] = h
	}
	if xid != 0 {
		h.unresolved = append(h.unresolved, xid)
	}
	h.cand = false
	if hk != unkeyed {
		if l := d.lanes[hk]; l != nil {
			d.dropQueued(l, h)
			d.settle(l)
		}
	}
	d.pollSoon(0)
	return h
}

// dropQueued forgets the rows queued on l: they stay in the table.
func (d *dispatcher) dropQueued(l *lane, h *handedKey) {
	for _, r := range l.queue {
		d.release(r)
		if r.tx != nil {
			h.unresolved = append(h.unresolved, r.tx.xid)
			d.rowDone(r)
		}
	}
	l.queue = nil
	l.single = 0
}

// release forgets that r is in flight.
func (d *dispatcher) release(r *streamRow) {
	delete(d.inflight, r.ID)
	if r.tx == nil {
		d.pollRows--
	}
}

// dbError reports a failed statement. When the server is shutting down,
// it ends the session: the server waits for its replication clients to
// confirm everything sent before it stops, which a session whose statements
// fail could never do; the next session resumes from the slot.
func (d *dispatcher) dbError(err error) {
	d.f.reportError(err)
	switch sqlState(err) {
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		if d.abortErr == nil {
			d.abortErr = fmt.Errorf("millbox cdc: the database is shutting down: %w", err)
			d.abort()
		}
	}
}

// releaseLater releases r once the read of the table in flight, whose
// snapshot may predate r's delete or failure record, has been handled.
func (d *dispatcher) releaseLater(r *streamRow) {
	if d.polling {
		d.afterPoll = append(d.afterPoll, r)
		return
	}
	d.release(r)
}

func (d *dispatcher) rowDone(r *streamRow) {
	if r.tx == nil || r.done {
		return
	}
	r.done = true
	r.tx.left--
}

// advance confirms the done prefix of the stream's transactions.
func (d *dispatcher) advance() {
	i := 0
	for i < len(d.txns) && d.txns[i].left == 0 {
		d.confirmed = max(d.confirmed, d.txns[i].end)
		i++
	}
	if i > 0 {
		clear(d.txns[:i])
		d.txns = d.txns[i:]
		if len(d.txns) == 0 {
			d.txns = nil
		}
	}
	d.f.confirmed.Store(uint64(d.confirmed))
	var oldest int64
	if len(d.txns) > 0 {
		oldest = d.txns[0].commit.UnixNano()
	}
	d.f.oldest.Store(oldest)
}

func (d *dispatcher) settle(l *lane) {
	if l.running || l.recording || l.paused {
		return
	}
	if len(l.queue) == 0 {
		if d.lanes[l.key] == l {
			delete(d.lanes, l.key)
			if l.hkey == unkeyed {
				d.unkeyedL--
			}
		}
		return
	}
	if !l.ready && !d.stopping {
		l.ready = true
		d.readyq = append(d.readyq, l)
	}
}

func (d *dispatcher) startCalls() {
	for d.active < d.cfg.Concurrency && len(d.readyq) > 0 && !d.stopping {
		l := d.readyq[0]
		d.readyq[0] = nil
		d.readyq = d.readyq[1:]
		l.ready = false
		if l.running || l.recording || l.paused || len(l.queue) == 0 {
			continue
		}
		n := min(len(l.queue), d.cfg.PublishBatch)
		if l.single > 0 {
			n = 1
		}
		l.call = l.queue[:n:n]
		l.queue = l.queue[n:]
		l.running = true
		d.active++
		go d.f.runCall(l, l.call, d.calls, d.quit)
	}
	if len(d.readyq) == 0 {
		d.readyq = nil
	}
}

func (d *dispatcher) onCall(r callResult) {
	l := r.l
	if r.timeout {
		// The call may still succeed: until it returns, the key must not
		// move. Count the attempt as failed and free its slot.
		d.active--
		l.hung = true
		d.f.reportError(r.err)
		if !d.stopping {
			d.fail(l, l.call[0], r.err)
		}
		return
	}
	if r.late {
		d.onLate(r)
		return
	}
	d.active--
	l.running = false
	rows := l.call
	l.call = nil
	if r.delivered > 0 {
		// Acknowledged: done for the slot's position. The delete is table
		// hygiene; a row whose delete is lost is published again after a
		// restart (it is pending then, so its key starts handed to polling).
		for _, row := range rows[:r.delivered] {
			if row.tx != nil {
				d.rowDone(row)
			}
		}
		d.delQ = append(d.delQ, rows[:r.delivered]...)
		if l.single > 0 {
			l.single = max(l.single-r.delivered, 0)
		}
	}
	if rest := rows[r.delivered:]; len(rest) > 0 {
		if d.stopping {
			for _, row := range rest {
				d.release(row)
			}
		} else {
			l.queue = append(slices.Clone(rest), l.queue...)
		}
	}
	if r.err == nil || d.stopping {
		if r.err == nil {
			d.errDelay = 0
		}
		d.settle(l)
		return
	}
	switch {
	case failure.Unavailable(r.err):
		d.errDelay = min(max(2*d.errDelay, 100*time.Millisecond), 5*time.Second)
		d.f.reportError(r.err)
		d.pause(l, d.errDelay)
	case len(rows)-r.delivered > 1 && !r.partial && !failure.IsPermanent(r.err):
		l.single = len(rows) - r.delivered
		d.settle(l)
	default:
		d.fail(l, l.queue[0], r.err)
	}
}

// onLate handles a call that returned after timing out. Its failure was
// recorded (or is being recorded) on its first row, which hands the key to
// polling: the rows it did not deliver are left in the table.
func (d *dispatcher) onLate(r callResult) {
	l := r.l
	l.running, l.hung = false, false
	rows := l.call
	l.call = nil
	for _, row := range rows[:r.delivered] {
		d.rowDone(row)
	}
	d.delQ = append(d.delQ, rows[:r.delivered]...)
	rest := rows[r.delivered:]
	switch {
	case l.recording || l.failRow != nil:
		// The record decides: it finds its row at the head of the queue.
		l.queue = append(slices.Clone(rest), l.queue...)
	default:
		h := d.hand(l.hkey, 0)
		for _, row := range rest {
			if row.tx != nil {
				h.unresolved = append(h.unresolved, row.tx.xid)
			}
			d.rowDone(row)
			d.releaseLater(row)
		}
	}
	d.settle(l)
	d.advance()
}

func (d *dispatcher) pause(l *lane, wait time.Duration) {
	l.paused = true
	time.AfterFunc(wait, func() {
		select {
		case d.resumes <- l:
		case <-d.ctx.Done():
			// The loop may be gone; it does not wait for paused lanes.
		}
	})
}

func (d *dispatcher) onResume(l *lane) {
	if !l.paused {
		return
	}
	l.paused = false
	if l.failRow != nil && !d.stopping {
		row, err := l.failRow, l.failErr
		l.failRow, l.failErr = nil, nil
		d.fail(l, row, err)
		return
	}
	if d.stopping {
		for _, r := range l.queue {
			d.release(r)
		}
		l.queue = nil
	}
	d.settle(l)
}

// fail records a failed attempt of row, the first row of l.
func (d *dispatcher) fail(l *lane, row *streamRow, cause error) {
	l.recording = true
	d.recording++
	go func() {
		dead, err := d.f.recordFailure(row, cause)
		d.records <- recordResult{l: l, row: row, dead: dead, err: err}
	}()
}

func (d *dispatcher) onRecord(r recordResult) {
	l := r.l
	l.recording = false
	d.recording--
	if r.err != nil {
		// Not stored: the row must not be left to polling yet. Keep it
		// and try to record again.
		d.dbError(r.err)
		d.f.cfg.Logger.Error("millbox cdc: cannot record a failed attempt; trying again", r.err, watermill.LogFields{"id": r.row.ID})
		if d.stopping {
			for _, row := range l.queue {
				d.release(row)
			}
			l.queue = nil
			d.settle(l)
			return
		}
		l.failRow, l.failErr = r.row, r.err
		d.pause(l, failure.Backoff(r.row.Attempts+1, d.f.cfg.MinBackoff, d.f.cfg.MaxBackoff, d.f.cfg.BackoffJitter))
		return
	}
	// The attempt is stored: the row, and every later row of its key, now
	// go through the polling path, which honours the backoff. A read in
	// flight may have seen the row before the record: until that read is
	// handled the row stays in flight and holds its key back there.
	if len(l.queue) > 0 && l.queue[0] == r.row {
		l.queue = l.queue[1:]
		if d.polling {
			if d.held == nil {
				d.held = map[int64]bool{}
			}
			d.held[r.row.ID] = true
		}
		d.releaseLater(r.row)
		if r.row.tx != nil {
			d.rowDone(r.row)
		}
	}
	var xid uint32
	if r.row.tx != nil {
		xid = r.row.tx.xid
	}
	h := d.hand(l.hkey, xid)
	d.dropQueued(l, h)
	if l.hung {
		// The hung call's rows are in the table and their key is handed:
		// they no longer hold the slot back.
		for _, row := range l.call {
			if row.tx != nil && !row.done {
				h.unresolved = append(h.unresolved, row.tx.xid)
			}
			d.rowDone(row)
		}
	}
	d.settle(l)
	d.advance()
}

// startDeletes sends published rows to be deleted, two statements at most
// in flight.
func (d *dispatcher) startDeletes() {
	for len(d.delQ) > 0 && d.deleting < 2 && !d.delWait {
		n := min(len(d.delQ), d.cfg.DeleteBatch)
		rows := slices.Clone(d.delQ[:n])
		d.delQ = d.delQ[n:]
		if len(d.delQ) == 0 {
			d.delQ = nil
		}
		d.deleting++
		go func() {
			retry, err := d.f.complete(rows)
			d.deleted <- deleteResult{rows: rows, retry: retry, err: err}
		}()
	}
}

func (d *dispatcher) onDeleted(r deleteResult) {
	d.deleting--
	if r.err != nil {
		d.dbError(r.err)
		d.delDelay = min(max(2*d.delDelay, 100*time.Millisecond), 5*time.Second)
		d.delQ = append(r.rows, d.delQ...)
		d.delWait = true
		time.AfterFunc(d.delDelay, func() {
			select {
			case d.delKick <- struct{}{}:
			default:
			}
		})
		return
	}
	d.delDelay = 0
	var again map[*streamRow]bool
	if len(r.retry) > 0 {
		again = make(map[*streamRow]bool, len(r.retry))
		for _, row := range r.retry {
			again[row] = true
		}
		d.delQ = append(d.delQ, r.retry...)
		d.delWait = true
		time.AfterFunc(10*time.Millisecond, func() {
			select {
			case d.delKick <- struct{}{}:
			default:
			}
		})
	}
	for _, row := range r.rows {
		if again[row] {
			continue
		}
		d.releaseLater(row)
	}
}

// pollSoon makes a read of the handed keys due after wait.
func (d *dispatcher) pollSoon(wait time.Duration) {
	d.pollTimer.Stop()
	select {
	case <-d.pollTimer.C:
	default:
	}
	if wait <= 0 {
		d.pollDue = true
		return
	}
	d.pollTimer.Reset(wait)
}

func (d *dispatcher) maybePoll() {
	if d.stopping || d.polling || !d.pollDue || len(d.handed) == 0 {
		return
	}
	d.pollDue = false
	d.polling = true
	keys := make([]string, 0, len(d.handed))
	withUnkeyed := false
	for k := range d.handed {
		if k == unkeyed {
			withUnkeyed = true
			continue
		}
		keys = append(keys, k)
	}
	limit := pollBatch + d.pollRows
	go func() {
		d.polls <- d.f.poll(d.ctx, keys, withUnkeyed, limit)
	}()
}

// pollBatch is the number of rows one read of the handed keys returns
// beyond the rows already in flight.
const pollBatch = 2000

func (d *dispatcher) onPoll(r pollResult) {
	d.polling = false
	defer func() {
		for _, row := range d.afterPoll {
			d.release(row)
		}
		d.afterPoll, d.held = nil, nil
	}()
	if r.err != nil {
		if d.ctx.Err() == nil {
			d.dbError(r.err)
		}
		d.pollDelay = min(max(2*d.pollDelay, 100*time.Millisecond), 5*time.Second)
		d.pollSoon(d.pollDelay)
		return
	}
	d.pollDelay = 0
	present := map[string]bool{}
	blocked := map[string]bool{}
	queued := 0
	next := d.cfg.PollInterval
	for _, row := range r.rows {
		hk := hkeyOf(row.Key, row.keyed)
		h := d.handed[hk]
		if h == nil {
			continue // back with the stream since the read started
		}
		present[hk] = true
		if d.held[row.ID] {
			blocked[hk] = true // its failure was recorded after the read began
		}
		if _, ok := d.inflight[row.ID]; ok || blocked[hk] || d.stopping {
			continue
		}
		if !row.due {
			next = min(next, row.wait+5*time.Millisecond) // read again when its retry is due
		}
		if row.keyed {
			if l := d.lanes[hk]; !row.due || (l != nil && (l.recording || l.failRow != nil || l.hung)) {
				blocked[hk] = true // waits for its retry: later rows of the key too
				continue
			}
		} else if !row.due {
			continue
		}
		h.cand = false
		d.enqueue(row.streamRow)
		queued++
	}
	if !r.full {
		for hk, h := range d.handed {
			if present[hk] {
				h.cand = false
				continue
			}
			if hk == unkeyed && d.unkeyedL > 0 || hk != unkeyed && d.lanes[hk] != nil {
				continue
			}
			h.unresolved = slices.DeleteFunc(h.unresolved, func(x uint32) bool { return precedes(x, r.mark.xmin) })
			if len(h.unresolved) == 0 && !h.cand {
				h.cand, h.candLSN = true, r.mark.lsn
				d.cands = append(d.cands, hk)
			}
		}
		d.checkCands()
	}
	if r.full || queued > 0 {
		next = min(next, 20*time.Millisecond)
	}
	d.pollSoon(next)
}

// checkCands gives back to the stream the candidate keys the stream has
// passed: every row committed before the read that found the key empty
// has come through the stream by now (and was left to polling, which
// blocks the candidate), so none can be published twice or skipped.
func (d *dispatcher) checkCands() {
	if len(d.cands) == 0 {
		return
	}
	d.cands = slices.DeleteFunc(d.cands, func(hk string) bool {
		h := d.handed[hk]
		switch {
		case h == nil || !h.cand:
			return true
		case d.processed >= h.candLSN:
			delete(d.handed, hk)
			return true
		}
		return false
	})
}

// lookup finds the key of a requeued row whose update did not carry it,
// once the update is visible.
func (d *dispatcher) lookup(id int64, xid uint32) {
	d.lookups++
	go func() {
		for {
			r, mark, err := d.f.keyOf(d.ctx, id)
			if err == nil && precedes(xid, mark.xmin) {
				r.xid = xid
				d.founds <- r
				return
			}
			if d.ctx.Err() != nil {
				d.founds <- lookupResult{}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}
