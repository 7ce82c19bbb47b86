package forwarder

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/sqladapters"
)

// maxErrorLength bounds the last_error stored with a failed row.
const maxErrorLength = 2000

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
	var perm permanentError
	dead = errors.As(cause, &perm) || (f.cfg.MaxAttempts > 0 && attempts >= f.cfg.MaxAttempts)
	fail := sqladapters.Failure{
		ID:       row.ID,
		Attempts: attempts,
		Error:    cleanError(cause),
		Backoff:  f.backoff(attempts),
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

// backoff is MinBackoff doubled per attempt, capped at MaxBackoff, ± jitter.
func (f *Forwarder) backoff(attempts int) time.Duration {
	d := f.cfg.MinBackoff
	for i := 1; i < attempts && d < f.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, f.cfg.MaxBackoff)
	if j := f.cfg.BackoffJitter; j > 0 && d > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return d
}

// cleanError makes an error storable as text in every database: valid
// UTF-8, no NUL bytes, bounded length.
func cleanError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > maxErrorLength {
		s = s[:maxErrorLength]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
