package forwarder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// ErrNotificationsLost is reported through Hooks.OnError and Status when
// the forwarder's notification listener does not receive a notification
// the forwarder sent itself through Config.DB (NotifyProbeInterval), or
// cannot listen at all. The forwarder then finds new rows by watching the
// outbox's high-water mark, as without notifications, until a probe
// arrives again. The wrapped error tells why.
var ErrNotificationsLost = errors.New("millbox: notifications do not arrive")

// notifyProbeTimeout is how long a probe may take to come back. A commit's
// notification normally arrives within milliseconds.
const notifyProbeTimeout = 2 * time.Second

// probe checks that notifications reach the listener. Any notification
// counts: one that arrives at all proves the listener's session receives
// what other sessions send, so when one arrived since the last check no
// probe is sent. Otherwise it notifies the forwarder's channel through
// Config.DB and waits. It returns nil when one arrived (and calls
// arrived), or when the probe
// could not be sent (an unreachable database proves nothing; the reads
// report it); the listener's outcome with ended set when it returned
// meanwhile (taken from errc); and an error naming the likely cause when
// nothing arrived.
func (f *Forwarder) probe(ctx context.Context, got <-chan struct{}, errc <-chan error, arrived func()) (ended bool, err error) {
	select {
	case <-got:
		arrived()
		return false, nil
	default:
	}
	if err := f.cfg.Dialect.NotifyProbe(ctx, f.cfg.DB); err != nil {
		return false, nil
	}
	t := time.NewTimer(notifyProbeTimeout)
	defer t.Stop()
	select {
	case <-got:
		arrived()
		return false, nil
	case err := <-errc:
		return true, err
	case <-ctx.Done():
		return false, nil
	case <-t.C:
		return false, fmt.Errorf("no notification came back within %v of the forwarder notifying its channel %q through Config.DB: "+
			"is the listener behind PgBouncer in transaction pooling? give it a direct connection "+
			"(pgxv5.WrapPool(pool, pgxv5.ListenOn(directURL)))", notifyProbeTimeout, f.channel)
	}
}

// notifyWatch tracks whether notifications arrive, logs the changes, and
// watches the outbox's high-water mark while they do not. It is used by
// the listen loop's goroutine only.
type notifyWatch struct {
	f      *Forwarder
	lost   bool
	loudAt time.Time
	cancel context.CancelFunc
	done   chan struct{}
}

// loudEvery repeats the error log while notifications stay lost.
const loudEvery = 5 * time.Minute

// lose records that notifications do not arrive because of err, and
// watches the outbox until they do again.
func (w *notifyWatch) lose(ctx context.Context, err error, retry time.Duration) {
	f := w.f
	err = fmt.Errorf("%w: %w", ErrNotificationsLost, err)
	f.reportError(err)
	fields := watermill.LogFields{"channel": f.channel, "listen_again_in": retry.String()}
	if !w.lost || time.Since(w.loudAt) >= loudEvery {
		w.loudAt = time.Now()
		f.cfg.Logger.Error("millbox forwarder: notifications do not arrive; watching the outbox for new rows meanwhile", err, fields)
	} else {
		f.cfg.Logger.Info("millbox forwarder: notifications still do not arrive: "+err.Error(), fields)
	}
	if !w.lost {
		w.lost = true
		w.start(ctx)
	}
}

// arrived records that a probe came back.
func (w *notifyWatch) arrived() {
	if !w.lost {
		return
	}
	w.lost = false
	w.stop()
	w.f.cfg.Logger.Info("millbox forwarder: notifications arrive again; no longer watching the outbox", watermill.LogFields{"channel": w.f.channel})
}

// start watches the high-water mark every WatchInterval and wakes the
// forwarder, with the quick follow-up reads of an in-process wakeup, when
// it moved (the sequence moves at insert, before commit). Without a
// high-water mark or with watching off, the poll alone finds new rows.
func (w *notifyWatch) start(ctx context.Context) {
	if !w.f.cfg.Dialect.Features().HighWaterMark || w.f.cfg.WatchInterval <= 0 {
		return
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.done = make(chan struct{})
	go func() {
		defer close(w.done)
		last := int64(-1)
		wait := w.f.cfg.WatchInterval
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			mark, err := w.f.cfg.Dialect.HighWaterMark(ctx, w.f.cfg.DB)
			switch {
			case err != nil:
				// The database is away: the reads report it; look less
				// often meanwhile.
				wait = min(max(2*wait, 100*time.Millisecond), w.f.cfg.PollInterval)
			case mark != last:
				last = mark
				w.f.nudge()
				fallthrough
			default:
				wait = w.f.cfg.WatchInterval
			}
			t.Reset(wait)
		}
	}()
}

// stop ends the watch, if one runs, and waits for it.
func (w *notifyWatch) stop() {
	if w.cancel == nil {
		return
	}
	w.cancel()
	<-w.done
	w.cancel, w.done = nil, nil
}
