package forwarder

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/sqladapters"
)

// recordEvent reports the outcome of recording a failed attempt.
type recordEvent struct {
	lane *lane
	dead bool
	err  error // recording itself failed
}

// recordFailure stores a failed attempt of row: its attempt count, error
// and next attempt time, or moves it to the dead letters. It runs even
// when Run's context has ended: the attempt happened.
func (f *Forwarder) recordFailure(row sqladapters.OutboxRow, cause error) (dead bool, err error) {
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
		f.tel.deadLettered(context.Background(), row.Topic, 1)
		f.cfg.Logger.Error("millbox forwarder: row moved to the dead letters", cause, fields)
	} else {
		fields["retry_in"] = fail.Backoff.String()
		f.cfg.Logger.Info("millbox forwarder: publish failed; will retry: "+fail.Error, fields)
	}
	if f.cfg.Hooks.OnFailure != nil {
		f.cfg.Hooks.OnFailure(FailedAttempt{
			ID: row.ID, UUID: row.UUID, Topic: row.Topic, Key: row.Key,
			Attempts: attempts, Error: fail.Error, Backoff: fail.Backoff, Dead: dead,
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(f.cfg.CloseTimeout, 5*time.Second))
	defer cancel()
	_, err = f.cfg.Dialect.RecordFailure(ctx, f.cfg.DB, fail)
	return dead, err
}
