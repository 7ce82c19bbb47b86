package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// recordingPublisher is the broker publisher plus a record of the events
// the broker accepted from the forwarder, kept to publish some again.
type recordingPublisher struct {
	message.Publisher
	mu    sync.Mutex
	seen  map[string]bool
	sent  []*message.Message // first delivery of each UUID, in order
	total atomic.Int64
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.seen == nil {
		p.seen = map[string]bool{}
	}
	for _, m := range msgs {
		if !p.seen[m.UUID] {
			p.seen[m.UUID] = true
			p.sent = append(p.sent, m.Copy())
		}
	}
	p.total.Store(int64(len(p.sent)))
	return nil
}

// count is the number of distinct events the broker accepted.
func (p *recordingPublisher) count() int { return int(p.total.Load()) }

// everyNth returns copies of every nth event forwarded so far.
func (p *recordingPublisher) everyNth(n int) []*message.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*message.Message
	for i := 0; i < len(p.sent); i += n {
		out = append(out, p.sent[i].Copy())
	}
	return out
}

// waitFor polls cond until it holds, ctx ends or timeout passes, calling
// status every second meanwhile.
func waitFor(ctx context.Context, timeout time.Duration, status func(), cond func() bool) error {
	deadline := time.Now().Add(timeout)
	next := time.Now().Add(time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		if time.Now().After(next) {
			status()
			next = next.Add(time.Second)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
