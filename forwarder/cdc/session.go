package cdc

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/forwarder/cdc/internal/pgoutput"
	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// unkeyed is the handed-key entry of the rows without an ordering key (a
// real key never contains NUL).
const unkeyed = "\x00"

func hkeyOf(key string, keyed bool) string {
	if keyed {
		return key
	}
	return unkeyed
}

// precedes compares 32-bit transaction ids modulo wraparound.
func precedes(a, b uint32) bool { return int32(a-b) < 0 }

// txn is a committed transaction of the stream whose rows are not all
// done. A row is done once the destination acknowledged it, or once it is
// left in the table to the polling path. The slot is confirmed up to the
// end of the last transaction of a done prefix.
type txn struct {
	end    pglogrepl.LSN
	commit time.Time
	xid    uint32
	left   int
}

// rowTag is the session's part of a row it handed to the engine.
type rowTag struct {
	sess *session
	tx   *txn  // the stream transaction it came in; nil when read by polling
	done bool  // counted as done in tx
	sid  int64 // the id the session knows it by
}

// handedKey is a key whose rows the polling path publishes.
type handedKey struct {
	// hidden holds the messages of publishers without a table that the
	// session writes into the outbox for this key, until a read is shown
	// to see them: a read's rows of the key after the lowest of them wait.
	hidden []*hiddenRow
	// unresolved holds the transaction ids of rows the stream left in the
	// table for this key and that no read has been shown to see yet.
	unresolved []uint32
	// cand: a read at candLSN found no row of the key, nothing of it in
	// the engine and every unresolved row visible to it. The key goes back
	// to the stream once the stream has passed candLSN, if nothing
	// happened to it since.
	cand    bool
	candLSN pglogrepl.LSN
}

// hiddenRow is an emitted row being written into the outbox: xid is the
// writing transaction's once written, 0 before.
type hiddenRow struct {
	id  int64
	xid uint32
}

// session is what the active reader knows of the stream, from the slot's
// confirmed position on: the transactions not done yet, the keys handed
// to polling, the rows it has in the engine. Its methods run on the
// engine's loop.
//
// A key whose row failed is handed to polling: its rows stay in the table,
// and a read of the handed keys publishes them in id order, honouring the
// backoff, passing over dead letters. A key goes back to the stream when
// a read finds no pending row of it, the engine holds nothing of it, every
// row the stream left to polling for it was visible to that read (its
// transaction ended before the read's snapshot), and the stream has passed
// the WAL position taken in that read: no row of the key committed before
// the read can then still come from the stream, so none is skipped and
// none published twice.
type session struct {
	s      *streamer
	ctx    context.Context // the session's: its reads end with it
	cancel context.CancelFunc
	start  sqladapters.StreamMark

	txns      []*txn
	confirmed pglogrepl.LSN
	processed pglogrepl.LSN

	handed   map[string]*handedKey
	cands    []string
	inflight map[int64]struct{} // rows of the session in the engine
	pollRows int                // of them, read by polling

	// Messages of publishers without a table (emitted rows): writes of
	// them into the outbox in flight, and per key how many of its rows
	// are being written.
	writes  int
	storing map[string]int
	ending  atomic.Bool // the session ends: rows given back are left to the next

	polling     bool            // a read of the handed keys is in flight or waits for the stream
	reading     bool            // the read's statement runs
	deferred    *pollResult     // a read done, waiting for the stream to pass its mark
	afterPoll   []*source.Row   // completed while a read was in flight
	pollBlocked map[string]bool // keys left while a read was in flight
	pollDue     bool
	pollTimer   *time.Timer
	pollAt      time.Time // when the timer makes a read due (zero: none set)
	pollGen     int
	pollRetry   retry.Backoff // paces reads of the handed keys after a failed one
	yield       bool          // a read had the last turn: the stream's transactions go next
	ended       bool

	abortErr atomic.Pointer[error] // set when the server is shutting down
	lostErr  atomic.Pointer[error] // set when the engine lost the outbox's transactions
}

func newSession(s *streamer, ctx context.Context, cancel context.CancelFunc, start sqladapters.StreamMark, confirmed pglogrepl.LSN, keys []sqladapters.StreamKey) *session {
	x := &session{
		pollRetry: retry.Backoff{Policy: retry.Operations},
		s:         s, ctx: ctx, cancel: cancel, start: start,
		confirmed: confirmed, processed: confirmed,
		handed: map[string]*handedKey{}, inflight: map[int64]struct{}{}, storing: map[string]int{},
	}
	// A backlog, or rows a previous reader left: their keys start with
	// polling.
	for _, k := range keys {
		x.handed[hkeyOf(k.Key, k.Keyed)] = &handedKey{}
	}
	return x
}

// end forgets the session's state; the engine is quiet.
func (x *session) end() {
	x.ended = true
	x.deferred = nil
	if x.pollTimer != nil {
		x.pollTimer.Stop()
	}
}

// onStream routes a committed transaction's rows and requeues, then moves
// the processed position.
func (x *session) onStream(ev pgoutput.Event) {
	if x.ended {
		return
	}
	tx := &txn{end: ev.End, commit: ev.Commit, xid: ev.XID, left: len(ev.Rows)}
	x.txns = append(x.txns, tx)
	var add, store []*source.Row
	for _, r := range ev.Rows {
		row := &source.Row{OutboxRow: r.OutboxRow, Keyed: r.Keyed, Created: ev.Commit, XID: ev.XID, Tag: &rowTag{sess: x, tx: tx}}
		if r.Emitted {
			row.XID, row.Emitted, row.KeyHash = 0, true, r.KeyHash
		}
		switch x.route(row) {
		case routeEngine:
			add = append(add, row)
		case routeStore:
			store = append(store, row)
		}
	}
	x.add(add)
	x.storeRows(store)
	for _, rq := range ev.Requeues {
		x.handOver(hkeyOf(rq.Key, rq.Keyed), ev.XID)
	}
	x.processed = max(x.processed, ev.End)
	x.s.emits = max(x.s.emits, ev.Emits)
	x.yield = false
	if d := x.deferred; d != nil && x.processed >= pglogrepl.LSN(d.mark.LSN) {
		x.deferred = nil
		x.handlePoll(*d)
	}
	x.checkCands()
	x.advance()
}

// Where route sends a row of the stream.
const (
	routeDone   = iota // done for the slot: nothing to do
	routeEngine        // to the engine
	routeStore         // an emitted row of a key handed to polling: into the outbox
)

// route tells where a row of the stream goes.
func (x *session) route(r *source.Row) int {
	t := r.Tag.(*rowTag)
	if h := x.handed[hkeyOf(r.Key, r.Keyed)]; h != nil {
		h.cand = false
		x.pollSoon(pollPace)
		if r.Emitted {
			// In no table: it joins the key's rows in the outbox, after
			// them, and the polling path publishes it.
			return routeStore
		}
		// Left in the table: the polling path publishes it, with its next
		// read.
		h.unresolved = append(h.unresolved, t.tx.xid)
		x.rowDone(t)
		return routeDone
	}
	if r.Emitted {
		// Nothing tells whether an emitted row was published before: the
		// slot's position says it was not done, so it goes (again).
		return routeEngine
	}
	if _, ok := x.inflight[r.ID]; ok {
		x.rowDone(t)
		return routeDone
	}
	if x.start.LSN != 0 && uint64(t.tx.end) <= x.start.LSN {
		if precedes(t.tx.xid, uint32(x.start.XMin)) {
			// Committed before this session's first read of the table,
			// which found no pending row of its key: published before.
			x.rowDone(t)
			return routeDone
		}
		if x.s.env.ExactlyOnce {
			// Committed before that read, which may not have seen it: an
			// earlier reader may have published it (and removed it, or
			// this session's claim did). The table tells: the polling
			// path publishes it if it is still pending.
			x.hand(hkeyOf(r.Key, r.Keyed), t.tx.xid)
			x.rowDone(t)
			return routeDone
		}
	}
	return routeEngine
}

// add hands rows to the engine. A row it rejects belongs to a key the
// engine holds back (a failure being recorded, a call that hangs): it
// stays in the table and its key goes to polling.
func (x *session) add(rows []*source.Row) {
	if len(rows) == 0 {
		return
	}
	for _, r := range rows {
		t := r.Tag.(*rowTag)
		t.sid = r.ID
		x.inflight[r.ID] = struct{}{}
		if t.tx == nil {
			x.pollRows++
		}
	}
	var store []*source.Row
	for _, r := range x.s.e.Add(rows) {
		x.release(r)
		switch t := r.Tag.(*rowTag); {
		case r.Emitted:
			if !x.abandoning() {
				store = append(store, r)
			}
		case t.tx != nil:
			x.hand(hkeyOf(r.Key, r.Keyed), t.tx.xid)
			x.rowDone(t)
		}
	}
	x.storeRows(store)
}

// abandoning tells that rows the engine gives back are left undone: the
// session or the forwarder ends, and the next reader streams them again
// from the slot.
func (x *session) abandoning() bool { return x.ending.Load() || x.ended || x.s.e.Stopping() }

// left takes back a row the engine gave up: it is in the table, and its
// key goes to polling. A read in flight may have started before the
// change that holds the key back there (a recorded failure), so its rows
// of the key are not taken.
func (x *session) left(r *source.Row, t *rowTag) {
	hk := hkeyOf(r.Key, r.Keyed)
	x.blockRead(hk)
	if r.Emitted {
		// In no table yet: written into the outbox after the key's rows
		// written before, unless the session ends.
		x.release(r)
		if !x.abandoning() {
			x.storeRows([]*source.Row{r})
		}
		return
	}
	var xid uint32
	if t.tx != nil && !t.done {
		xid = t.tx.xid
	}
	x.hand(hk, xid)
	x.rowDone(t)
	x.releaseLater(r)
}

// hand gives key hk to the polling path: rows of it arriving from the
// stream are left in the table.
func (x *session) hand(hk string, xid uint32) *handedKey {
	h := x.handed[hk]
	if h == nil {
		h = &handedKey{}
		x.handed[hk] = h
	}
	if xid != 0 {
		h.unresolved = append(h.unresolved, xid)
	}
	h.cand = false
	x.pollSoon(0)
	return h
}

// handOver hands key hk to polling and takes its queued rows back from the
// engine: a requeued dead letter has a lower id than they, and polling
// publishes the key's rows in id order.
func (x *session) handOver(hk string, xid uint32) {
	x.hand(hk, xid)
	x.blockRead(hk)
	if hk != unkeyed {
		x.s.e.Yield(hk)
	}
}

// blockRead makes the read of the handed keys in flight, whose snapshot
// may predate a row of hk that became pending (a requeue, a row written
// into the outbox), leave hk's rows to the next read.
func (x *session) blockRead(hk string) {
	if !x.polling {
		return
	}
	if x.pollBlocked == nil {
		x.pollBlocked = map[string]bool{}
	}
	x.pollBlocked[hk] = true
}

func (x *session) release(r *source.Row) {
	t := r.Tag.(*rowTag)
	delete(x.inflight, t.sid)
	if t.tx == nil {
		x.pollRows--
	}
}

// releaseLater releases r once the read of the table in flight, whose
// snapshot may predate r's delete or failure record, has been handled.
func (x *session) releaseLater(r *source.Row) {
	if x.polling {
		x.afterPoll = append(x.afterPoll, r)
		return
	}
	x.release(r)
}

func (x *session) rowDone(t *rowTag) {
	if t.tx == nil || t.done {
		return
	}
	t.done = true
	t.tx.left--
}

// advance confirms the done prefix of the stream's transactions.
func (x *session) advance() {
	i := 0
	for i < len(x.txns) && x.txns[i].left == 0 {
		x.confirmed = max(x.confirmed, x.txns[i].end)
		i++
	}
	if i > 0 {
		clear(x.txns[:i])
		x.txns = x.txns[i:]
		if len(x.txns) == 0 {
			x.txns = nil
		}
	}
	x.s.confirmed.Store(uint64(x.confirmed))
	var oldest int64
	if len(x.txns) > 0 {
		oldest = x.txns[0].commit.UnixNano()
	}
	x.s.oldest.Store(oldest)
}

// dbError reports a failed statement. When the server is shutting down,
// it ends the session: the server waits for its replication clients to
// confirm everything sent before it stops, which a session whose statements
// fail could never do; the next session resumes from the slot.
func (x *session) dbError(err error) {
	x.s.env.ReportError(err)
	switch sqlState(err) {
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		if x.abortErr.Load() == nil {
			e := fmt.Errorf("millbox cdc: the database is shutting down: %w", err)
			x.abortErr.Store(&e)
			x.cancel()
		}
	}
}

// pollSoon makes a read of the handed keys due after wait, unless one is
// due sooner already.
func (x *session) pollSoon(wait time.Duration) {
	if x.ended || x.pollDue {
		return
	}
	at := time.Now().Add(wait)
	if x.pollTimer != nil && !x.pollAt.IsZero() && !x.pollAt.After(at) {
		return
	}
	if x.pollTimer != nil {
		x.pollTimer.Stop()
	}
	x.pollGen++
	if wait <= 0 {
		x.pollDue, x.pollAt = true, time.Time{}
		return
	}
	gen := x.pollGen
	x.pollAt = at
	x.pollTimer = time.AfterFunc(wait, func() {
		x.s.e.Do(func() {
			if gen == x.pollGen {
				x.pollDue, x.pollAt = true, time.Time{}
			}
		})
	})
}

// maybePoll reads the rows of the handed keys when a read is due and the
// engine grants it. Keys the engine holds back are left out.
func (x *session) maybePoll() {
	if x.ended || x.polling || !x.pollDue || len(x.handed) == 0 || x.s.e.Stopping() {
		return
	}
	if x.yield && len(x.s.feed) > 0 {
		// The stream and the reads of the handed keys take turns for the
		// engine's room: while the engine grants rows only now and then
		// (a call hangs, and none ends), reads of a handed key whose rows
		// the engine keeps refusing would otherwise take every turn, and
		// the stream's transactions would wait behind them.
		return
	}
	if !x.s.e.Grant() {
		return
	}
	x.yield = true
	x.pollDue = false
	x.polling, x.reading = true, true
	held := x.s.e.HeldKeys()
	keys := make([]string, 0, len(x.handed))
	withUnkeyed := false
	for k := range x.handed {
		switch {
		case k == unkeyed:
			withUnkeyed = true
		case !slices.Contains(held, k):
			keys = append(keys, k)
		}
	}
	limit := x.s.env.BatchSize + x.pollRows
	ctx, lg, db, holds := x.ctx, x.s.lg, x.s.env.DB, x.s.env.DeadLetterHolds
	go func() {
		readAt := time.Now()
		mark, rows, err := lg.ReadKeys(ctx, db, keys, withUnkeyed, limit, holds)
		res := pollResult{keys: keys, unkeyed: withUnkeyed, readAt: readAt, mark: mark, rows: rows, full: len(rows) >= limit, err: err}
		x.s.e.Do(func() { x.onPoll(res) })
	}()
}

// pollPace is the least time between two reads that a row left to polling
// makes due: a handed key's rows arriving from the stream do not make
// every read start again at once.
const pollPace = 10 * time.Millisecond

type pollResult struct {
	keys    []string // the keys read: a held key left out says nothing
	unkeyed bool
	readAt  time.Time // row ages count from it
	mark    sqladapters.StreamMark
	rows    []sqladapters.KeyedRow
	full    bool
	err     error
}

// onPoll takes the result of a read of the handed keys. Where a call of a
// publisher without a table may have committed before the read that the
// stream has not decoded yet (the read saw a number drawn from the count
// of such calls that the stream has not brought, or the count does not
// exist), it waits until the stream has passed the read's position: every
// message of a handed key committed before the read has then come through
// the stream and is being written into the outbox (hidden), and the read's
// rows of the key after it wait for a read that sees it. Where every
// publisher writes into the table, the count never moves and reads never
// wait.
func (x *session) onPoll(r pollResult) {
	x.reading = false
	mayWait := r.mark.Emits < 0 || r.mark.Emits > x.s.emits
	if !x.ended && r.err == nil && mayWait && x.processed < pglogrepl.LSN(r.mark.LSN) {
		x.deferred = &r
		return
	}
	x.handlePoll(r)
}

func (x *session) handlePoll(r pollResult) {
	x.polling = false
	defer func() {
		for _, row := range x.afterPoll {
			x.release(row)
		}
		x.afterPoll, x.pollBlocked = nil, nil
	}()
	if x.ended {
		return
	}
	if r.err != nil {
		if x.ctx.Err() == nil {
			x.dbError(fmt.Errorf("millbox cdc: read handed keys: %w", r.err))
		}
		x.pollSoon(x.pollRetry.Next(r.err))
		return
	}
	x.s.env.Read(len(r.rows))
	x.pollRetry.Reset()
	present := map[string]bool{}
	blocked := map[string]bool{}
	next := x.s.cfg.PollInterval
	var add []*source.Row
	for _, h := range x.handed {
		// Written rows the read saw are in its result, in id order.
		h.hidden = slices.DeleteFunc(h.hidden, func(e *hiddenRow) bool { return e.xid != 0 && precedes(e.xid, uint32(r.mark.XMin)) })
	}
	for _, row := range r.rows {
		hk := hkeyOf(row.Key, row.Keyed)
		h := x.handed[hk]
		if h == nil {
			continue // back with the stream since the read started
		}
		if row.Holds {
			// A dead letter holds the key: its later rows wait, and the
			// key stays with polling until it is requeued or discarded.
			present[hk], blocked[hk] = true, true
			continue
		}
		if slices.ContainsFunc(h.hidden, func(e *hiddenRow) bool { return e.id < row.ID }) {
			// A message of the key with a lower id is being written:
			// the key's rows wait for a read that sees it.
			present[hk], blocked[hk] = true, true
			next = min(next, pollPace)
			continue
		}
		present[hk] = true
		if x.pollBlocked[hk] {
			blocked[hk] = true // left after the read began
		}
		if _, ok := x.inflight[row.ID]; ok || blocked[hk] {
			continue
		}
		if !row.Due {
			next = min(next, row.Wait+5*time.Millisecond) // read again when its retry is due
			if row.Keyed {
				blocked[hk] = true // waits for its retry: later rows of the key too
			}
			continue
		}
		h.cand = false
		sr := &source.Row{OutboxRow: row.OutboxRow, Keyed: row.Keyed, Tag: &rowTag{sess: x}}
		if row.Age > 0 {
			sr.Created = r.readAt.Add(-row.Age)
		}
		add = append(add, sr)
	}
	before := len(x.inflight)
	x.add(add)
	queued := len(x.inflight) - before
	if !r.full {
		read := make(map[string]bool, len(r.keys)+1)
		for _, k := range r.keys {
			read[k] = true
		}
		read[unkeyed] = r.unkeyed
		for hk, h := range x.handed {
			if present[hk] {
				h.cand = false
				continue
			}
			if !read[hk] || x.s.e.Holds(hk, hk != unkeyed) || x.storing[hk] > 0 {
				continue // not empty, or rows of it are being written
			}
			h.unresolved = slices.DeleteFunc(h.unresolved, func(id uint32) bool { return precedes(id, uint32(r.mark.XMin)) })
			if len(h.unresolved) == 0 && !h.cand {
				h.cand, h.candLSN = true, pglogrepl.LSN(r.mark.LSN)
				x.cands = append(x.cands, hk)
			}
		}
		x.checkCands()
	}
	if r.full || queued > 0 {
		next = min(next, 20*time.Millisecond)
	}
	x.pollSoon(next)
}

// checkCands gives back to the stream the candidate keys the stream has
// passed: every row committed before the read that found the key empty
// has come through the stream by now (and was left to polling, which
// blocks the candidate), so none can be published twice or skipped.
func (x *session) checkCands() {
	if len(x.cands) == 0 {
		return
	}
	x.cands = slices.DeleteFunc(x.cands, func(hk string) bool {
		h := x.handed[hk]
		switch {
		case h == nil || !h.cand:
			return true
		case x.processed >= h.candLSN:
			delete(x.handed, hk)
			return true
		}
		return false
	})
}
