package polling

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
)

// In exactly-once mode the polling source reads only partitions that are
// both leased and acquired by the engine (source.Engine.Acquire): claimed
// at the destination, which fences the partition's previous holder, with
// the rows it had published removed. The lease keeper decides what this
// instance holds; the acquirer (acquireLoop) acquires what it holds and
// has not acquired, on a goroutine of its own so that a destination that
// is slow or away never delays lease renewals. A partition the engine
// loses (Lost) is acquired again before it is read.

// acquireLoop acquires the leased partitions that are not acquired,
// whenever that set may have grown, and tries again after a failure. It
// closes first once its first attempt ended, so that the forwarder counts
// as running when it can publish (or has said why it cannot).
func (p *poller) acquireLoop(ctx context.Context, first chan<- struct{}) {
	backoff := retry.Backoff{Policy: retry.Operations}
	var lastLog time.Time
	firstDone := func() {
		if first != nil {
			close(first)
			first = nil
		}
	}
	defer firstDone()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.acquireCh:
		}
		for {
			want := p.unacquired()
			if len(want) == 0 {
				firstDone()
				break
			}
			got, err := p.e.Acquire(ctx, want)
			p.leaseMu.Lock()
			var stray []int
			for _, q := range got {
				if p.owns(q) {
					p.acquired[q] = true
				} else {
					stray = append(stray, q) // released meanwhile
				}
			}
			p.leaseMu.Unlock()
			if len(stray) > 0 {
				p.e.Release(stray)
			}
			if len(got) > 0 {
				p.env.Logger.Debug("millbox forwarder: acquired partitions", watermill.LogFields{"partitions": got})
				p.wake()
			}
			firstDone()
			if err == nil {
				backoff.Reset()
				continue
			}
			if ctx.Err() != nil {
				return
			}
			p.env.ReportError(err)
			if time.Since(lastLog) > 10*time.Second {
				lastLog = time.Now()
				p.env.Logger.Error("millbox forwarder: cannot acquire partitions; their rows wait until it succeeds", err,
					watermill.LogFields{"partitions": want})
			}
			sleep(ctx, backoff.Next(err))
		}
	}
}

// signalAcquire tells the acquirer to look; any goroutine.
func (p *poller) signalAcquire() {
	select {
	case p.acquireCh <- struct{}{}:
	default:
	}
}

// unacquired returns the partitions leased, with a valid lease, and not
// acquired.
func (p *poller) unacquired() []int {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	if time.Now().After(p.leaseDeadline) {
		return nil
	}
	var want []int
	for _, q := range p.owned {
		if !p.acquired[q] {
			want = append(want, q)
		}
	}
	return want
}

// owns tells whether q is leased; leaseMu held.
func (p *poller) owns(q int) bool {
	for _, o := range p.owned {
		if o == q {
			return true
		}
	}
	return false
}

// notOwned drops the acquired partitions that are no longer leased and
// returns them; leaseMu held.
func (p *poller) notOwned() []int {
	var gone []int
	for q := range p.acquired {
		if !p.owns(q) {
			delete(p.acquired, q)
			gone = append(gone, q)
		}
	}
	return gone
}

// afterOwned releases the partitions no longer leased and has the
// acquirer look at the new ones.
func (p *poller) afterOwned(gone []int) {
	if p.acquired == nil {
		return
	}
	if len(gone) > 0 {
		p.e.Release(gone)
	}
	p.signalAcquire()
}

// readable returns the partitions to read in exactly-once mode: leased
// and acquired; nil with ok means all. leaseMu held.
func (p *poller) readable() ([]int, bool) {
	var rd []int
	for _, q := range p.owned {
		if p.acquired[q] {
			rd = append(rd, q)
		}
	}
	switch {
	case len(rd) == 0:
		return nil, false
	case len(rd) == p.cfg.Partitions:
		return nil, true
	}
	return rd, true
}

// Lost implements source.Source: the partition is read again once
// acquired again.
func (p *poller) Lost(partition int) {
	if p.acquired == nil {
		return
	}
	p.leaseMu.Lock()
	delete(p.acquired, partition)
	p.leaseMu.Unlock()
	p.signalAcquire()
}
