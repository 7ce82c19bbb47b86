package forwarder

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// breakerKeys is how many different keys must fail in a row, with no
// success in between, for the breaker to open on errors it does not
// recognise as the destination being unavailable.
const breakerKeys = 5

// Probe delays while the breaker is open: the first probe follows at
// once, then the delay doubles up to probeMax, so a destination that
// comes back is noticed within about probeMax.
const (
	probeMin = 50 * time.Millisecond
	probeMax = time.Second
)

// breaker pauses the whole forwarder while the destination is down: no
// reads, no calls but one probe at a time. Failures that are about a
// message keep their per-key backoff and dead letters instead.
type breaker struct {
	open       bool
	since      time.Time
	delay      time.Duration
	probing    bool
	probeRead  bool // one read is allowed, to find a row to probe with
	failedKeys map[string]struct{}
}

func (b *breaker) success() { clear(b.failedKeys) }

// keyFailed notes a failed call of key and tells whether enough different
// keys failed in a row to suspect the destination.
func (b *breaker) keyFailed(key string) bool {
	if b.failedKeys == nil {
		b.failedKeys = map[string]struct{}{}
	}
	b.failedKeys[key] = struct{}{}
	return len(b.failedKeys) >= breakerKeys
}

func (e *engine) openBreaker(cause error) {
	b := &e.breaker
	if b.open {
		return
	}
	b.open, b.since, b.delay, b.probing = true, time.Now(), probeMin, false
	e.clearReady()
	e.f.reportError(cause)
	e.cfg.Logger.Error("millbox forwarder: destination unavailable; pausing every key and probing until it is back", cause,
		watermill.LogFields{"probe_every_max": probeMax.String()})
	e.probe.Reset(b.delay)
}

// scheduleProbe plans the next probe after one failed; backoff doubles
// the delay, up to probeMax.
func (e *engine) scheduleProbe(backoff bool) {
	b := &e.breaker
	b.probing = false
	if !b.open {
		return
	}
	if backoff {
		b.delay = min(2*b.delay, probeMax)
	}
	e.probe.Reset(b.delay)
}

// sendProbe sends the first row of one waiting lane. With nothing to
// probe (the waiting rows were given up, say for a lost lease), one read
// is allowed to find some.
func (e *engine) sendProbe() {
	b := &e.breaker
	if !b.open || b.probing {
		return
	}
	if e.halted() {
		e.probe.Reset(b.delay)
		return
	}
	for _, l := range e.lanes {
		if len(l.queue) > 0 && l.call == nil && !l.blocked() {
			if e.tx != nil {
				if !e.tx.probe(l) {
					continue // its partition cannot send now
				}
			} else {
				e.start(l, true)
			}
			b.probing = true
			return
		}
	}
	b.probeRead = true
	b.delay = min(2*b.delay, probeMax)
	e.probe.Reset(b.delay)
}

func (e *engine) closeBreaker() {
	b := &e.breaker
	if !b.open {
		return
	}
	e.cfg.Logger.Info("millbox forwarder: destination is back; resuming",
		watermill.LogFields{"paused_for": time.Since(b.since).Round(time.Millisecond).String()})
	b.open, b.probing, b.probeRead = false, false, false
	b.success()
	e.probe.Stop()
	for _, l := range e.lanes {
		e.settle(l)
	}
}
