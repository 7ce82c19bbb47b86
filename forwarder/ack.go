package forwarder

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// deleteChunk bounds the ids of one delete statement.
const deleteChunk = 5000

// enqueueAck hands published ids to the deleter. They stay excluded from
// reads until deleted. It blocks while the deleter is one batch behind,
// which bounds both the exclusion list and the work lost to a crash.
func (f *Forwarder) enqueueAck(ids []int64) {
	f.ackMu.Lock()
	for _, id := range ids {
		f.ackPending[id] = struct{}{}
	}
	f.ackMu.Unlock()
	f.ackWG.Add(1)
	f.ackCh <- ids
}

// ackLoop deletes (or marks) published rows until ackCh is closed.
func (f *Forwarder) ackLoop() {
	for ids := range f.ackCh {
		f.complete(ids)
		f.ackMu.Lock()
		for _, id := range ids {
			delete(f.ackPending, id)
		}
		f.ackMu.Unlock()
		f.ackWG.Done()
	}
}

// complete retries until the rows are gone or CloseTimeout passed; rows it
// cannot delete stay in the outbox and are published again later (at least
// once).
func (f *Forwarder) complete(ids []int64) {
	deadline := time.Now().Add(max(f.cfg.CloseTimeout, time.Second))
	delay := 50 * time.Millisecond
	for start := 0; start < len(ids); {
		end := min(start+deleteChunk, len(ids))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := f.cfg.Dialect.CompleteForwarded(ids[start:end], f.cfg.KeepForwarded).Exec(ctx, f.cfg.DB)
		cancel()
		if err == nil {
			start = end
			continue
		}
		if time.Now().After(deadline) {
			f.cfg.Logger.Error("millbox forwarder: cannot remove published rows; they will be published again", err,
				watermill.LogFields{"rows": end - start})
			start = end
			continue
		}
		f.cfg.Logger.Error("millbox forwarder: removing published rows failed; retrying", err, nil)
		time.Sleep(delay)
		delay = min(2*delay, 2*time.Second)
	}
}
