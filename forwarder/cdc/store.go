package cdc

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// This file writes messages of publishers without a table into the
// tables: a message whose delivery failed, and the later messages of its
// key, which then wait in the outbox with the key's table rows and go out
// through the polling path in id order. One writer does every such write,
// in the order the engine's loop asked for them, so that a key's messages
// get ascending ids in the order the stream brought them.

// storeJob is one write of the writer.
type storeJob struct {
	ms []sqladapters.WrittenMessage
	// retry: tried again until written or the forwarder stops (messages
	// that only wait); else tried once (a failed attempt, which the
	// engine retries its own way).
	retry bool
	// done runs on the engine's loop with the writing transaction's id.
	done func(xid uint32, err error)
}

// writer runs storeJobs one after the other, in the order they came.
type writer struct {
	s    *streamer
	mu   sync.Mutex
	jobs []storeJob
	more chan struct{}
	quit chan struct{}
	done chan struct{}
}

func newWriter(s *streamer) *writer {
	return &writer{s: s, more: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// add queues a job; it never blocks the loop.
func (w *writer) add(j storeJob) {
	w.mu.Lock()
	w.jobs = append(w.jobs, j)
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default:
	}
}

// run does the jobs until ctx ends and no job is left: jobs queued while
// the forwarder stops fail at once (their messages are not confirmed on
// the slot, and the next reader streams them again).
func (w *writer) run(ctx context.Context) {
	defer close(w.done)
	for {
		w.mu.Lock()
		var j storeJob
		have := len(w.jobs) > 0
		if have {
			j = w.jobs[0]
			w.jobs[0] = storeJob{}
			w.jobs = w.jobs[1:]
		}
		w.mu.Unlock()
		if have {
			xid, err := w.write(ctx, j)
			if !w.s.e.Do(func() { j.done(xid, err) }) {
				return
			}
			continue
		}
		select {
		case <-w.more:
		case <-w.quit:
			return
		}
	}
}

// stop ends run once the engine has stopped.
func (w *writer) stop() {
	close(w.quit)
	<-w.done
}

func (w *writer) write(ctx context.Context, j storeJob) (uint32, error) {
	backoff := retry.Backoff{Policy: retry.Operations}
	for {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		xid, err := w.s.lg.WriteMessages(wctx, w.s.env.DB, j.ms)
		cancel()
		if err == nil || !j.retry || ctx.Err() != nil {
			return xid, err
		}
		w.s.env.ReportError(err)
		delay := backoff.Next(err)
		w.s.env.Logger.Error("millbox cdc: cannot write messages of publishers without a table into the outbox; retrying", err,
			watermill.LogFields{"messages": len(j.ms), "retry_in": delay.String()})
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// written is the emitted row r as the writer writes it.
func written(r *source.Row, f *sqladapters.Failure) sqladapters.WrittenMessage {
	return sqladapters.WrittenMessage{
		OutboxMessage: sqladapters.OutboxMessage{
			Topic: r.Topic, UUID: r.UUID, Payload: r.Payload, Metadata: r.Metadata, Key: r.Key, KeyHash: r.KeyHash,
		},
		ID:      r.ID,
		Created: r.Created,
		Failure: f,
	}
}

// StoreFailure implements source.Storer: the failed attempt of an emitted
// row goes into the outbox (or the dead letters) after every write queued
// before it. Its key is handed to polling once it is written.
func (s *streamer) StoreFailure(row *source.Row, f sqladapters.Failure, done func(id int64, err error)) {
	x, _ := row.Tag.(*rowTag)
	hk := hkeyOf(row.Key, row.Keyed)
	var hidden *hiddenRow
	if x != nil && x.sess == s.sess {
		x.sess.storing[hk]++
		x.sess.writes++
		hidden = x.sess.hide(hk, row.ID)
	}
	id := row.ID
	s.store.add(storeJob{ms: []sqladapters.WrittenMessage{written(row, &f)}, done: func(xid uint32, err error) {
		if x != nil && x.sess == s.sess {
			sess := x.sess
			sess.storing[hk]--
			sess.writes--
			if err == nil && !sess.ended {
				hidden.xid = xid
				sess.hand(hk, xid)
			}
		}
		done(id, err)
	}})
}

// storeRows writes emitted rows that wait for their key into the outbox,
// pending, in order; each is done for the slot once written. The session
// hands their keys to polling.
func (x *session) storeRows(rows []*source.Row) {
	if len(rows) == 0 {
		return
	}
	ms := make([]sqladapters.WrittenMessage, len(rows))
	keys := make([]string, len(rows))
	hidden := make([]*hiddenRow, len(rows))
	for i, r := range rows {
		ms[i] = written(r, nil)
		keys[i] = hkeyOf(r.Key, r.Keyed)
		x.storing[keys[i]]++
		hidden[i] = x.hide(keys[i], r.ID)
	}
	x.writes++
	x.s.store.add(storeJob{ms: ms, retry: true, done: func(xid uint32, err error) {
		x.writes--
		for _, hk := range keys {
			x.storing[hk]--
		}
		if err != nil || x.ended {
			return // not done: the next reader streams them again
		}
		for i, r := range rows {
			hidden[i].xid = xid
			x.hand(keys[i], xid)
			x.rowDone(r.Tag.(*rowTag))
		}
		x.advance()
	}})
}

// hide hands key hk to polling and notes that its row id is being written
// into the outbox: the key's later rows wait for a read that sees it.
func (x *session) hide(hk string, id int64) *hiddenRow {
	h := x.hand(hk, 0)
	x.blockRead(hk)
	e := &hiddenRow{id: id}
	h.hidden = append(h.hidden, e)
	return e
}
