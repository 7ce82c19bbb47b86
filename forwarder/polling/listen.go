package polling

import (
	"context"
	"errors"
	"sync"
	"time"
)

// listenLoop keeps a notification listener running, checks that
// notifications arrive (probe.go) and listens again with backoff after a
// failure. While notifications do not arrive, the forwarder watches the
// outbox's high-water mark as it does without a listener. listening is
// closed once the forwarder knows which of the two it does.
func (p *poller) listenLoop(ctx context.Context, listening chan<- struct{}) {
	var once sync.Once
	known := func() { once.Do(func() { close(listening) }) }
	w := &notifyWatch{p: p}
	maxDelay := 5 * time.Second
	if p.cfg.NotifyProbeInterval > 0 {
		maxDelay = max(maxDelay, p.cfg.NotifyProbeInterval)
	}
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := p.listenSession(ctx, func() {
			delay = 100 * time.Millisecond
			w.arrived()
			known()
		})
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("millbox: the notification listener stopped")
		}
		w.lose(err, delay)
		known()
		sleep(ctx, delay)
		delay = min(2*delay, maxDelay)
	}
}

// listenSession subscribes once and probes at once and every
// NotifyProbeInterval. It calls arrived for each probe that came back (or
// once subscribed, when probing is off), and
// returns when the listener fails or a probe does not come back.
func (p *poller) listenSession(ctx context.Context, arrived func()) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan struct{}, 1)
	ready := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- p.listener.Listen(lctx, p.channel, func() { close(ready) }, func() {
			select {
			case got <- struct{}{}:
			default:
			}
			p.wake()
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		return err
	}
	p.wake() // covers notifications sent while nobody listened
	if p.cfg.NotifyProbeInterval < 0 {
		arrived()
		return <-errc
	}
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case err := <-errc:
			return err
		case <-next.C:
		}
		ended, err := p.probe(lctx, got, errc, arrived)
		if ended {
			return err
		}
		if err != nil {
			cancel()
			return errors.Join(err, <-errc)
		}
		next.Reset(p.cfg.NotifyProbeInterval)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
