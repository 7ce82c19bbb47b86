package cdc

import (
	"context"

	"github.com/millbox/millbox/forwarder/cdc/internal/writer"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// This file writes messages of publishers without a table into the
// tables: a message whose delivery failed, and the later messages of its
// key, which then wait in the outbox with the key's table rows and go out
// through the polling path in id order. One writer does every such write,
// in the order the engine's loop asked for them, so that a key's messages
// get ascending ids in the order the stream brought them.

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
	s.store.Add(s.writeJob([]sqladapters.WrittenMessage{written(row, &f)}, false, func(xid uint32, err error) {
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
	}))
}

// writeJob is a job of the writer that writes ms into the outbox.
func (s *streamer) writeJob(ms []sqladapters.WrittenMessage, retry bool, done func(xid uint32, err error)) writer.Job {
	return writer.Job{
		Write:    func(ctx context.Context) (uint32, error) { return s.lg.WriteMessages(ctx, s.env.DB, ms) },
		Messages: len(ms),
		Retry:    retry,
		Done:     done,
	}
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
	x.s.store.Add(x.s.writeJob(ms, true, func(xid uint32, err error) {
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
	}))
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
