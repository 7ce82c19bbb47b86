package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/completer"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/source"
)

// txEngine is the engine's exactly-once mode (Config.ExactlyOnce). The
// lanes stay as they are: one per key, one call of a key at a time, the
// failure records, the breaker. What changes is how ready lanes are sent:
// the ready lanes of one partition go together into one transaction of
// the destination (destination.TxDestination.PublishTx), with the partition's
// progress; a partition has one transaction in flight at most; and each
// lane learns the transaction's outcome as if its own call had returned
// it.
//
// A partition takes rows only once acquired (source.Engine.Acquire):
// claimed at the destination, which fences every earlier holder, and with
// the rows its last committed transaction published removed from the
// outbox. It is lost again when a transaction's outcome is unknown, when
// another holder fenced this one, or when published rows could not be
// removed: its rows go back to the table and the source acquires it
// again before it reads more of it.
//
// Its state is the engine loop's, like the engine's.
type txEngine struct {
	e      *Engine
	dest   destination.TxDestination
	parts  map[int]*txPart
	due    []*txPart // partitions with waiting lanes and no transaction in flight
	events chan txEvent
	wg     sync.WaitGroup // releases of the destination's partitions
}

// txPart is one partition of the outbox in exactly-once mode.
type txPart struct {
	id        int
	gen       int  // bumped by every acquire, loss and release
	ready     bool // acquired: its rows are taken
	release   bool // let the destination's partition go once idle
	busy      *txCall
	released  chan struct{} // closed once the last ReleasePartition returned
	waiting   []*lane       // ready lanes, in the order they became ready
	queued    bool          // in txEngine.due
	published map[int64]uint32
}

// txCall is one transaction: the calls of the lanes it carries.
type txCall struct {
	part  *txPart
	id    int // the partition, for the call's goroutine
	gen   int
	calls []*call
	probe bool
}

// txEvent reports a transaction to the loop: that it passed
// PublishTimeout (timeout), or its outcome.
type txEvent struct {
	tc       *txCall
	timeout  bool
	prepared []int   // per call: leading rows turned into messages
	prepErr  []error // per call: why the next row could not be
	err      error
	took     time.Duration
}

func newTxEngine(e *Engine, dest destination.TxDestination) *txEngine {
	return &txEngine{e: e, dest: dest, parts: map[int]*txPart{}, events: make(chan txEvent, 16)}
}

func (t *txEngine) part(id int) *txPart {
	tp := t.parts[id]
	if tp == nil {
		tp = &txPart{id: id, published: map[int64]uint32{}}
		t.parts[id] = tp
	}
	return tp
}

// takes tells whether the engine takes r now: its partition is acquired.
func (t *txEngine) takes(r *source.Row) bool {
	tp := t.parts[r.Partition]
	return tp != nil && tp.ready
}

// wait puts a lane with rows to send on its partition's waiting list.
func (t *txEngine) wait(l *lane) {
	tp := t.parts[l.part]
	if tp == nil || !tp.ready {
		t.e.drop(l)
		return
	}
	l.ready = true
	tp.waiting = append(tp.waiting, l)
	t.queue(tp)
}

func (t *txEngine) queue(tp *txPart) {
	if !tp.queued && tp.busy == nil && len(tp.waiting) > 0 {
		tp.queued = true
		t.due = append(t.due, tp)
	}
}

// clearWaiting empties every waiting list (the breaker opened, the engine
// gave its idle lanes back).
func (t *txEngine) clearWaiting() {
	for _, tp := range t.parts {
		for _, l := range tp.waiting {
			l.ready = false
		}
		tp.waiting, tp.queued = nil, false
	}
	t.due = nil
}

// start sends a transaction for each partition that has waiting lanes and
// none in flight, within Concurrency.
func (t *txEngine) start() {
	e := t.e
	if e.halted() || e.breaker.open {
		return
	}
	for len(t.due) > 0 && e.active < e.cfg.Concurrency {
		tp := t.due[0]
		t.due[0] = nil
		t.due = t.due[1:]
		tp.queued = false
		if tp.busy == nil && tp.ready {
			t.send(tp, nil)
		}
	}
	if len(t.due) == 0 {
		t.due = nil
	}
}

// sendable tells whether a waiting lane can go into a transaction now.
func (t *txEngine) sendable(l *lane) bool {
	return t.e.lanes[l.key] == l && l.call == nil && !l.blocked() && len(l.queue) > 0
}

// send starts a transaction of tp: the probe lane's first row, or a lane
// looking for its failing row alone with one row, or else every waiting
// lane with up to PublishBatch rows each, BatchSize rows in all.
func (t *txEngine) send(tp *txPart, probe *lane) {
	e := t.e
	type pick struct {
		l *lane
		n int
	}
	var picks []pick
	if probe != nil {
		picks = append(picks, pick{probe, 1})
	} else {
		// Every lane on the list has ready set; the list is rebuilt here
		// with those that wait for the next transaction.
		waiting := tp.waiting
		tp.waiting = nil
		var alone *lane
		for _, l := range waiting {
			if !t.sendable(l) {
				l.ready = false
				continue
			}
			if alone == nil && l.single > 0 {
				alone = l
			}
		}
		budget := e.cfg.BatchSize
		if alone != nil {
			picks = append(picks, pick{alone, 1})
			budget = 0
		}
		for _, l := range waiting {
			if !l.ready || l == alone {
				continue
			}
			if budget == 0 {
				tp.waiting = append(tp.waiting, l)
				continue
			}
			n := min(len(l.queue), e.cfg.PublishBatch, budget)
			picks = append(picks, pick{l, n})
			budget -= n
		}
	}
	if len(picks) == 0 {
		return
	}
	tc := &txCall{part: tp, id: tp.id, gen: tp.gen, probe: probe != nil}
	var extra []progressRow
	for _, p := range picks {
		l := p.l
		l.ready = false
		c := &call{lane: l, rows: l.queue[:p.n:p.n], probe: probe != nil}
		l.queue = l.queue[p.n:]
		e.buffered -= p.n
		l.call = c
		tc.calls = append(tc.calls, c)
		for _, r := range c.rows {
			extra = append(extra, progressRow{id: r.ID, xid: r.XID})
		}
	}
	tp.busy = tc
	e.callStarted()
	progress := encodeProgress(tp.published, extra)
	go e.run(tc.calls, tc, progress)
}

// probe sends l's first row alone, to see whether the destination is
// back; false when l's partition cannot send now.
func (t *txEngine) probe(l *lane) bool {
	tp := t.parts[l.part]
	if tp == nil || !tp.ready || tp.busy != nil {
		return false
	}
	if l.ready {
		l.ready = false
		tp.waiting = slices.DeleteFunc(tp.waiting, func(w *lane) bool { return w == l })
	}
	t.send(tp, l)
	return true
}

// onTxn hands a transaction's outcome to its lanes. A transaction that
// passed PublishTimeout is only reported: its context is cancelled, and
// the destination returns (PublishTx must, once its context ends) with
// an outcome that is handled as any other.
func (t *txEngine) onTxn(ev txEvent) {
	e := t.e
	if ev.timeout {
		e.obs.Error(ev.err)
		e.logLimited("millbox forwarder: a transaction passed PublishTimeout; waiting for the destination to abort it", ev.err,
			watermill.LogFields{"partition": ev.tc.id})
		return
	}
	tc, tp := ev.tc, ev.tc.part
	e.active--
	e.callEnded()
	tp.busy = nil
	current := tc.gen == tp.gen
	st := Batch{Duration: ev.took}
	for i, c := range tc.calls {
		st.Messages += len(c.rows)
		if ev.err == nil {
			st.Forwarded += ev.prepared[i]
		}
	}
	st.Failed = st.Messages - st.Forwarded
	e.obs.Batch(st)
	var aborted *destination.TxAbortedError
	switch {
	case ev.err == nil:
		for i, c := range tc.calls {
			n := ev.prepared[i]
			if current {
				for _, r := range c.rows[:n] {
					tp.published[r.ID] = r.XID
				}
			}
			t.outcome(c, n, ev.prepErr[i], true)
		}
	case errors.As(ev.err, &aborted):
		rows := 0
		for _, c := range tc.calls {
			rows += len(c.rows)
		}
		alone := len(tc.calls) == 1 && rows == 1
		unavailable, probed := false, false // probed: a lane's outcome handled the probe
		for i, c := range tc.calls {
			cause := aborted.Failed[i]
			switch {
			case ev.prepared[i] == 0:
				// Not in the transaction: its first row could not be
				// turned into a message.
				t.outcome(c, 0, ev.prepErr[i], true)
				probed = true
			case cause != nil && alone:
				// Sent alone: the row is the culprit.
				t.outcome(c, 0, cause, false)
				probed = true
			case cause != nil && failure.Unavailable(cause):
				unavailable = true
				t.retry(c, 0, ev.err)
			case cause != nil:
				// Failed with others: it may have failed for another
				// key's message. Sent alone, one row at a time, it
				// shows which row fails.
				t.retry(c, len(c.rows), cause)
			default:
				t.retry(c, 0, nil)
			}
		}
		if unavailable || (len(aborted.Failed) == 0 && failure.Unavailable(ev.err)) {
			e.openBreaker(ev.err)
		}
		if tc.probe && !probed {
			e.scheduleProbe(true)
		}
	default:
		// The outcome is unknown, or another holder took the partition:
		// the rows go back to the table, and the partition is acquired
		// again (which removes them if they were published after all)
		// before any of its rows is read.
		for _, c := range tc.calls {
			l := c.lane
			l.call = nil
			e.src.Left(c.rows)
			l.failed = true // its queued rows go back too
			e.settle(l)
		}
		if current {
			t.lose(tp, ev.err)
		} else {
			e.obs.Error(ev.err)
			e.cfg.Logger.Error("millbox forwarder: a transaction of a partition this forwarder gave up failed; its rows stay in the outbox", ev.err,
				watermill.LogFields{"partition": tp.id})
		}
		if failure.Unavailable(ev.err) {
			e.openBreaker(ev.err)
		}
		if tc.probe {
			e.scheduleProbe(true)
		}
	}
	if tp.release && tp.busy == nil {
		t.releaseDest(tp)
	}
	t.queue(tp)
}

// outcome reports a lane's part of a transaction as the return of its own
// call: n leading rows delivered, then err (nil: all delivered). partial
// tells that err is about row n precisely.
func (t *txEngine) outcome(c *call, n int, err error, partial bool) {
	t.e.onCall(callEvent{c: c, kind: eventTx, delivered: n, partial: partial, err: err})
}

// retry puts a lane's rows back in front of its queue, to go again in a
// later transaction; single > 0 sends them one per transaction.
func (t *txEngine) retry(c *call, single int, cause error) {
	e := t.e
	l := c.lane
	l.call = nil
	l.queue = append(c.rows, l.queue...)
	e.buffered += len(c.rows)
	if single > 0 {
		l.single = max(l.single, single)
		if cause != nil {
			e.cfg.Logger.Debug("millbox forwarder: a transaction failed with other keys; sending the key's rows alone",
				watermill.LogFields{"key": l.okey, "rows": single, "error": cause.Error()})
		}
	}
	e.settle(l)
}

// lose gives up a partition until it is acquired again: its idle lanes go
// back to the table, busy ones once their call ended, and the source
// reads none of its rows before it acquired it again.
func (t *txEngine) lose(tp *txPart, cause error) {
	e := t.e
	if !tp.ready {
		return
	}
	t.unready(tp)
	e.obs.Error(cause)
	// Not rate-limited: at most once per partition between two claims.
	e.cfg.Logger.Error("millbox forwarder: lost a partition's transactions; claiming it again before publishing more of it", cause,
		watermill.LogFields{"partition": tp.id})
	e.src.Lost(tp.id)
}

// unready stops taking tp's rows and gives its lanes back.
func (t *txEngine) unready(tp *txPart) {
	e := t.e
	tp.ready = false
	tp.gen++
	for _, l := range tp.waiting {
		l.ready = false
	}
	tp.waiting = nil
	for _, l := range e.lanes {
		if l.part != tp.id {
			continue
		}
		if l.call == nil && !l.recording {
			l.holding = false
			e.drop(l)
		} else {
			l.failed = true
		}
	}
}

// onAcked notes rows removed from the outbox, and loses the partitions of
// rows that could not be: they were published, and must be removed before
// their partition is read again.
func (t *txEngine) onAcked(b completer.Batch) {
	for _, r := range b.Done {
		if tp := t.parts[r.Partition]; tp != nil {
			delete(tp.published, r.ID)
		}
	}
	for _, r := range b.Left {
		if tp := t.parts[r.Partition]; tp != nil {
			t.lose(tp, fmt.Errorf("published rows could not be removed from the outbox (row %d)", r.ID))
		}
	}
}

// acquire claims partitions at the destination and removes the rows their
// last committed transactions published, concurrently; it returns those
// that are ready. Runs on a goroutine of the source.
func (t *txEngine) acquire(ctx context.Context, partitions []int) ([]int, error) {
	var (
		mu       sync.Mutex
		acquired []int
		errs     []error
		wg       sync.WaitGroup
	)
	for _, p := range partitions {
		wg.Go(func() {
			err := t.acquireOne(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("partition %d: %w", p, err))
				return
			}
			acquired = append(acquired, p)
		})
	}
	wg.Wait()
	return acquired, errors.Join(errs...)
}

func (t *txEngine) acquireOne(ctx context.Context, p int) error {
	e := t.e
	var gen int
	var released chan struct{}
	if !e.sync(func() {
		tp := t.part(p)
		if tp.ready {
			t.unready(tp)
		}
		tp.release = false
		gen, released = tp.gen, tp.released
	}) {
		return destination.ErrClosed
	}
	if released != nil {
		// A release of the partition's previous claim is under way.
		select {
		case <-released:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	progress, err := t.dest.ClaimPartition(ctx, p)
	if err != nil {
		return fmt.Errorf("claim at the destination: %w", err)
	}
	rows, err := decodeProgress(progress)
	if err != nil {
		return err
	}
	if len(rows) > 0 {
		srows := make([]*source.Row, len(rows))
		for i, r := range rows {
			srows[i] = &source.Row{XID: r.xid}
			srows[i].ID = r.id
		}
		if err := e.del.Now(ctx, srows, 30*time.Second); err != nil {
			return fmt.Errorf("remove the %d rows the partition's last transaction published: %w", len(rows), err)
		}
		e.cfg.Logger.Debug("millbox forwarder: removed rows published before the partition was claimed",
			watermill.LogFields{"partition": p, "rows": len(rows), "first": rows[0].id, "last": rows[len(rows)-1].id})
	}
	ok := false
	if !e.sync(func() {
		tp := t.part(p)
		if tp.gen != gen {
			return // released or acquired again meanwhile
		}
		tp.ready, tp.gen = true, tp.gen+1
		clear(tp.published)
		ok = true
	}) {
		return destination.ErrClosed
	}
	if !ok {
		return errors.New("released while being claimed")
	}
	return nil
}

// release stops taking the partitions' rows and lets the destination's
// partitions go once their transactions in flight ended.
func (t *txEngine) release(partitions []int) {
	for _, p := range partitions {
		tp := t.parts[p]
		if tp == nil {
			continue
		}
		if tp.ready {
			t.unready(tp)
		} else {
			tp.gen++
		}
		tp.release = true
		if tp.busy == nil {
			t.releaseDest(tp)
		}
	}
}

func (t *txEngine) releaseDest(tp *txPart) {
	tp.release = false
	id, prev, done := tp.id, tp.released, make(chan struct{})
	tp.released = done
	t.wg.Go(func() {
		defer close(done)
		if prev != nil {
			<-prev
		}
		t.dest.ReleasePartition(id)
	})
}

// close lets every partition go at the destination; the loop has ended.
func (t *txEngine) close() {
	for _, tp := range t.parts {
		t.releaseDest(tp)
	}
	t.wg.Wait()
}
