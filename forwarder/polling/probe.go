package polling

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
func (p *poller) probe(ctx context.Context, got <-chan struct{}, errc <-chan error, arrived func()) (ended bool, err error) {
	select {
	case <-got:
		arrived()
		return false, nil
	default:
	}
	if err := p.env.Dialect.NotifyProbe(ctx, p.env.DB); err != nil {
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
			"(pgxv5.WrapPool(pool, pgxv5.ListenOn(directURL)))", notifyProbeTimeout, p.channel)
	}
}

// notifyWatch tracks whether notifications arrive, logs the changes, and
// has the high-water mark watched while they do not. It is used by the
// listen loop's goroutine only.
type notifyWatch struct {
	p      *poller
	lost   bool
	loudAt time.Time
}

// loudEvery repeats the error log while notifications stay lost.
const loudEvery = 5 * time.Minute

// lose records that notifications do not arrive because of err, and has
// the outbox watched until they do again.
func (w *notifyWatch) lose(err error, retry time.Duration) {
	p := w.p
	err = fmt.Errorf("%w: %w", ErrNotificationsLost, err)
	p.env.ReportError(err)
	fields := watermill.LogFields{"channel": p.channel, "listen_again_in": retry.String()}
	if !w.lost || time.Since(w.loudAt) >= loudEvery {
		w.loudAt = time.Now()
		p.env.Logger.Error("millbox forwarder: notifications do not arrive; watching the outbox for new rows meanwhile", err, fields)
	} else {
		p.env.Logger.Info("millbox forwarder: notifications still do not arrive: "+err.Error(), fields)
	}
	w.lost = true
	p.watchWanted.Store(true)
}

// arrived records that a probe came back.
func (w *notifyWatch) arrived() {
	if !w.lost {
		return
	}
	w.lost = false
	w.p.watchWanted.Store(false)
	w.p.env.Logger.Info("millbox forwarder: notifications arrive again; no longer watching the outbox", watermill.LogFields{"channel": w.p.channel})
}
