package engine

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// recordEvent reports the outcome of recording a failed attempt.
type recordEvent struct {
	lane *lane
	row  *source.Row
	dead bool
	err  error // recording itself failed
	id   int64 // the table id an emitted row was written under
}

// recordFailure stores a failed attempt of row: its attempt count, error
// and next attempt time, or moves it to the dead letters. It runs even
// when Run's context has ended: the attempt happened.
func (e *Engine) recordFailure(row *source.Row, cause error) (dead bool, err error) {
	fail := e.failureOf(row, cause)
	e.reportFailure(row, fail, cause)
	ctx, cancel := context.WithTimeout(context.Background(), max(e.cfg.CloseTimeout, 5*time.Second))
	defer cancel()
	for i := 0; ; i++ {
		n, err := e.cfg.Dialect.RecordFailure(ctx, e.cfg.DB, fail)
		if err != nil || n > 0 || row.XID == 0 || i == 100 {
			return fail.Dead, err
		}
		// Seen in a replication stream a moment before its transaction
		// is visible to other sessions: try again; not found after a
		// while, the row is gone.
		time.Sleep(20 * time.Millisecond)
	}
}

// failureOf returns the failure record of a failed attempt of row.
func (e *Engine) failureOf(row *source.Row, cause error) sqladapters.Failure {
	attempts := row.Attempts + 1
	dead := failure.IsPermanent(cause) || (e.cfg.MaxAttempts > 0 && attempts >= e.cfg.MaxAttempts)
	return sqladapters.Failure{
		ID:       row.ID,
		Attempts: attempts,
		Error:    failure.Text(cause),
		Backoff:  e.cfg.Retry.NextRetry(attempts, cause),
		Dead:     dead,
		Hold:     dead && e.cfg.DeadLetterHoldsKey && row.Keyed,
	}
}

// reportFailure logs a failed attempt and reports it to the observer. A
// row in no table (Emitted) is logged and reported
// without an id.
func (e *Engine) reportFailure(row *source.Row, fail sqladapters.Failure, cause error) {
	attempts, dead := fail.Attempts, fail.Dead
	fields := watermill.LogFields{"uuid": row.UUID, "topic": row.Topic, "attempts": attempts}
	id := row.ID
	if row.Emitted {
		id = 0
	} else {
		fields["id"] = id
	}
	if dead {
		e.cfg.Logger.Error("millbox forwarder: row moved to the dead letters", cause, fields)
	} else {
		fields["retry_in"] = fail.Backoff.String()
		e.cfg.Logger.Info("millbox forwarder: publish failed; will retry: "+fail.Error, fields)
	}
	e.obs.Failure(Failure{
		ID: id, UUID: row.UUID, Topic: row.Topic, Key: row.Key,
		Attempts: attempts, Error: fail.Error, Backoff: fail.Backoff, Dead: dead,
	})
}
