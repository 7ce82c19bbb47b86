package engine

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
)

// breakerKeys is how many different keys must fail in a row, with no
// success in between, for the breaker to open on errors it does not
// recognise as the destination being unavailable.
const breakerKeys = 5

// probeMax is the longest wait between two probes (retry.Probes): a
// destination that comes back is noticed within about that long.
var probeMax = retry.Probes.Max

// breaker pauses the whole forwarder while the destination is down: no
// reads, no calls but one probe at a time. Failures that are about a
// message keep their per-key backoff and dead letters instead.
type breaker struct {
	open       bool
	since      time.Time
	delay      time.Duration // before the next probe
	backoff    retry.Backoff // paces the probes
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

func (e *Engine) openBreaker(cause error) {
	b := &e.breaker
	if b.open {
		return
	}
	b.open, b.since, b.probing = true, time.Now(), false
	b.backoff = retry.Backoff{Policy: retry.Probes}
	b.delay = b.backoff.Next(cause)
	e.clearReady()
	e.obs.Error(cause)
	e.cfg.Logger.Error("millbox forwarder: destination unavailable; pausing every key and probing until it is back", cause,
		watermill.LogFields{"probe_every_max": probeMax.String()})
	e.probe.Reset(b.delay)
}

// scheduleProbe plans the next probe after one failed; backoff doubles
// the delay, up to probeMax.
func (e *Engine) scheduleProbe(backoff bool) {
	b := &e.breaker
	b.probing = false
	if !b.open {
		return
	}
	if backoff {
		b.delay = b.backoff.Next(nil)
	}
	e.probe.Reset(b.delay)
}

// sendProbe sends the first row of one waiting lane. With nothing to
// probe (the waiting rows were given up, say for a lost lease), one read
// is allowed to find some.
func (e *Engine) sendProbe() {
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
	b.delay = b.backoff.Next(nil)
	e.probe.Reset(b.delay)
}

func (e *Engine) closeBreaker() {
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
