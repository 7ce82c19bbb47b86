package mover

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/wake"
	"github.com/millbox/millbox/sqladapters"
)

// Config is what a Mover needs.
type Config struct {
	DB      sqladapters.DB
	Dialect sqladapters.Dialect
	// Interval is the longest time between two looks at the scheduled
	// table.
	Interval time.Duration
	// BatchSize is the most rows one move takes.
	BatchSize int
	Logger    watermill.LoggerAdapter
	// ReportError reports an error the mover retries.
	ReportError func(error)
	// Wake, when set, makes the mover look at once whenever it receives.
	Wake <-chan struct{}
}

// Mover moves scheduled messages into the outbox once they are due.
// Concurrent moves (of other instances) never move a message twice, and
// the rows a move writes reach the instance owning them as any insert
// does (a read of the polling source, woken in this process and by a
// notification where the dialect notifies; the replication stream of
// cdc.Source).
type Mover struct {
	cfg Config
	sub *wake.DueSub
	// next is when the mover looks next; it looks at least once per
	// Interval, and at the earliest due time it knows of.
	next time.Time
	// awaited is the earliest due time a publisher of this process
	// reported and no move has answered yet. The publisher reports before
	// its transaction commits, so when that time comes and the move finds
	// nothing, the mover looks again after retry, doubling up to
	// awaitRetryMax (the transaction may also have rolled back).
	awaited time.Time
	retry   time.Duration
	lastErr time.Time // when an error was last logged
}

// awaitRetryMin and awaitRetryMax bound the looks again after a due time
// a publisher of this process reported.
const (
	awaitRetryMin = 20 * time.Millisecond
	awaitRetryMax = 2 * time.Second
)

// Run looks at once and then until ctx ends. It subscribes to the due
// times this process's publishers write.
func Run(ctx context.Context, cfg Config) {
	sub, unsubscribe := wake.SubscribeDue(cfg.Dialect.OutboxTable())
	defer unsubscribe()
	m := &Mover{cfg: cfg, sub: sub}
	m.run(ctx)
}

func (m *Mover) run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.sub.C():
			if t := m.sub.Take(); !t.IsZero() {
				m.await(t)
				if t.Before(m.next) {
					m.next = t
					timer.Reset(time.Until(t))
				}
			}
			continue
		case <-m.cfg.Wake:
		case <-timer.C:
		}
		moved, next, err := m.move(ctx)
		if err != nil && ctx.Err() == nil {
			m.logError(err)
		}
		wait := m.cfg.Interval
		if !next.IsZero() {
			wait = min(wait, time.Until(next))
		}
		if !m.awaited.IsZero() && !time.Now().Before(m.awaited) {
			if moved > 0 || m.retry >= awaitRetryMax {
				m.awaited, m.retry = time.Time{}, 0
			} else {
				m.retry = max(2*m.retry, awaitRetryMin)
				wait = min(wait, m.retry)
			}
		}
		// A due time reported while the move ran may come before it.
		if t := m.sub.Take(); !t.IsZero() {
			m.await(t)
			wait = min(wait, time.Until(t))
		}
		wait = max(wait, 0)
		m.next = time.Now().Add(wait)
		timer.Reset(wait)
	}
}

// await notes a due time a publisher of this process reported.
func (m *Mover) await(t time.Time) {
	if m.awaited.IsZero() || t.Before(m.awaited) {
		m.awaited, m.retry = t, 0
	}
}

// move moves every message due now, a batch at a time, and returns how
// many it moved and the earliest due time still scheduled (zero when none
// is).
func (m *Mover) move(ctx context.Context) (int64, time.Time, error) {
	var total int64
	defer func() {
		if total > 0 {
			wake.Rows(m.cfg.Dialect.OutboxTable())
			m.notify(ctx)
		}
	}()
	for {
		n, next, err := m.cfg.Dialect.MoveDue(ctx, m.cfg.DB, time.Now(), m.cfg.BatchSize)
		total += n
		if err != nil || n < int64(m.cfg.BatchSize) || ctx.Err() != nil {
			return total, next, err
		}
	}
}

// notify wakes the forwarders of other processes where the outbox insert
// notifies: the move's rows did not.
func (m *Mover) notify(ctx context.Context) {
	if m.cfg.Dialect.NotifyChannel() == "" {
		return
	}
	if err := m.cfg.Dialect.NotifyProbe(ctx, m.cfg.DB); err != nil && ctx.Err() == nil {
		m.logError(err)
	}
}

// logError logs err at most every ten seconds and reports it.
func (m *Mover) logError(err error) {
	m.cfg.ReportError(err)
	if time.Since(m.lastErr) < 10*time.Second {
		return
	}
	m.lastErr = time.Now()
	m.cfg.Logger.Error("millbox forwarder: cannot move due scheduled messages into the outbox", err,
		watermill.LogFields{"table": m.cfg.Dialect.OutboxTable()})
}
