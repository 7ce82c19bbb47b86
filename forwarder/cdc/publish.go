package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/metadata"
	"github.com/millbox/millbox/sqladapters"
)

// runCall publishes the leading rows of one topic and reports how many
// the destination acknowledged, unless quit closed meanwhile: the
// dispatcher does not wait for a call that passed PublishTimeout.
func (f *Forwarder) runCall(l *lane, rows []*streamRow, out chan<- callResult, quit <-chan struct{}) {
	msgs := make([]*message.Message, 0, len(rows))
	var topic string
	var prepErr error
	for i, r := range rows {
		m, t, err := f.prepare(r)
		if err != nil {
			prepErr = err
			break
		}
		if i == 0 {
			topic = t
		} else if t != topic {
			break
		}
		msgs = append(msgs, m)
	}
	res := callResult{l: l}
	var mu sync.Mutex
	timedOut := false
	if len(msgs) > 0 {
		timer := time.AfterFunc(f.cfg.PublishTimeout, func() {
			mu.Lock()
			defer mu.Unlock()
			timedOut = true
			select {
			case out <- callResult{l: l, timeout: true, err: fmt.Errorf("millbox cdc: Publish did not return within PublishTimeout %v", f.cfg.PublishTimeout)}:
			case <-quit:
			}
		})
		err := f.publish(topic, msgs)
		timer.Stop()
		res.delivered = forwarder.DeliveredPrefix(err, len(msgs))
		if err != nil {
			var pe *forwarder.PartialError
			res.partial = errors.As(err, &pe)
			res.err = err
		}
	}
	if res.err == nil && prepErr != nil {
		// The row after the delivered ones is the culprit.
		res.err, res.partial = prepErr, true
	}
	mu.Lock()
	defer mu.Unlock()
	res.late = timedOut
	select {
	case out <- res:
	case <-quit:
	}
}

func (f *Forwarder) publish(topic string, msgs []*message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("destination publisher panicked: %v", p)
		}
	}()
	return f.cfg.Publisher.Publish(topic, msgs...)
}

// prepare turns a row into the message the polling forwarder sends for
// it: the same UUID, payload and metadata (the ordering key among them).
func (f *Forwarder) prepare(r *streamRow) (msg *message.Message, topic string, err error) {
	msg = message.NewMessage(r.UUID, r.Payload)
	if err := metadata.Decode(r.Metadata, &msg.Metadata); err != nil {
		return nil, "", failure.Permanent(fmt.Errorf("malformed metadata %.100q: %w", r.Metadata, err))
	}
	topic = r.Topic
	if f.cfg.Topic != nil {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("topic mapping panicked: %v", p)
			}
		}()
		topic, err = f.cfg.Topic(r.Topic, msg)
		switch {
		case err != nil:
			return nil, "", fmt.Errorf("topic mapping: %w", err)
		case topic == "":
			return nil, "", fmt.Errorf("topic mapping returned an empty topic for %q", r.Topic)
		}
	}
	return msg, topic, nil
}

// recordFailure stores a failed attempt of row with the dialect's
// RecordFailure: attempts, last error, next attempt time, or the dead
// letters.
func (f *Forwarder) recordFailure(row *streamRow, cause error) (dead bool, err error) {
	attempts := row.Attempts + 1
	dead = failure.IsPermanent(cause) || (f.cfg.MaxAttempts > 0 && attempts >= f.cfg.MaxAttempts)
	fail := sqladapters.Failure{
		ID:       row.ID,
		Attempts: attempts,
		Error:    failure.Text(cause),
		Backoff:  failure.Backoff(attempts, f.cfg.MinBackoff, f.cfg.MaxBackoff, f.cfg.BackoffJitter),
		Dead:     dead,
	}
	fields := watermill.LogFields{"id": row.ID, "uuid": row.UUID, "topic": row.Topic, "attempts": attempts}
	if dead {
		f.cfg.Logger.Error("millbox cdc: row moved to the dead letters", cause, fields)
	} else {
		fields["retry_in"] = fail.Backoff.String()
		f.cfg.Logger.Info("millbox cdc: publish failed; will retry: "+fail.Error, fields)
	}
	if f.cfg.Hooks.OnFailure != nil {
		f.cfg.Hooks.OnFailure(forwarder.FailedAttempt{
			ID: row.ID, UUID: row.UUID, Topic: row.Topic, Key: row.Key,
			Attempts: attempts, Error: fail.Error, Backoff: fail.Backoff, Dead: dead,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(f.cfg.CloseTimeout, 5*time.Second))
	defer cancel()
	for i := 0; ; i++ {
		n, err := f.cfg.Dialect.RecordFailure(ctx, f.cfg.DB, fail)
		if err != nil || n > 0 || row.tx == nil || i == 100 {
			// Not found after a while: the row is gone.
			return dead, err
		}
		// The stream may deliver a transaction a moment before its rows
		// are visible to other sessions.
		time.Sleep(20 * time.Millisecond)
	}
}

// complete deletes published rows, or stamps them with KeepForwarded, and
// returns those it could not find yet: the stream may deliver a
// transaction a moment before its rows are visible to other sessions.
// Rows whose transaction ended before the statement's snapshot and that
// it did not find are gone (completed before) and count as done.
func (f *Forwarder) complete(rows []*streamRow) (retry []*streamRow, err error) {
	ids := make([]int64, len(rows))
	for i, r := range rows {
		ids[i] = r.ID
	}
	change := `DELETE FROM ` + f.cfg.Dialect.OutboxTable() + ` WHERE id = ANY($1::bigint[]) RETURNING id`
	if f.cfg.KeepForwarded {
		change = `UPDATE ` + f.cfg.Dialect.OutboxTable() + ` SET published_at = now() WHERE id = ANY($1::bigint[]) AND published_at IS NULL RETURNING id`
	}
	q := `WITH s AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin), c AS (` + change + `)
SELECT s.xmin, c.id FROM s LEFT JOIN c ON true`
	ctx, cancel := context.WithTimeout(context.Background(), max(f.cfg.CloseTimeout, 5*time.Second))
	defer cancel()
	res, err := f.cfg.DB.Query(ctx, q, int64Array(ids))
	if err != nil {
		return nil, fmt.Errorf("millbox cdc: complete published rows: %w", f.cfg.Dialect.ClassifyError(err))
	}
	defer res.Close()
	found := make(map[int64]struct{}, len(rows))
	var xmin uint32
	for res.Next() {
		var x string
		var id sql.NullInt64
		if err := res.Scan(&x, &id); err != nil {
			return nil, err
		}
		v, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return nil, err
		}
		xmin = uint32(v)
		if id.Valid {
			found[id.Int64] = struct{}{}
		}
	}
	if err := res.Err(); err != nil {
		return nil, fmt.Errorf("millbox cdc: complete published rows: %w", f.cfg.Dialect.ClassifyError(err))
	}
	if len(found) == len(rows) {
		return nil, nil
	}
	for _, r := range rows {
		if _, ok := found[r.ID]; !ok && r.tx != nil && !precedes(r.tx.xid, xmin) {
			retry = append(retry, r)
		}
	}
	return retry, nil
}

func int64Array(ids []int64) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	b.WriteByte('}')
	return b.String()
}

func (f *Forwarder) reportError(err error) {
	if f.cfg.Hooks.OnError != nil {
		f.cfg.Hooks.OnError(err)
	}
}
