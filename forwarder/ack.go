package forwarder

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// deleteChunk bounds the ids of one delete statement.
const deleteChunk = 5000

// deleter removes published rows (or stamps them, with KeepForwarded) in
// the background, in as few statements as the backlog allows, and reports
// each batch back once it is gone.
type deleter struct {
	f    *Forwarder
	mu   sync.Mutex
	ids  []int64
	more chan struct{} // signalled when ids grew
	quit chan struct{} // closed by close: flush and stop
	done chan struct{}
	out  chan<- ackedBatch
}

// ackedBatch is a batch of ids the deleter is done with. kept, when not
// zero, is the lowest of them it could not remove: those rows are pending
// again.
type ackedBatch struct {
	ids  []int64
	kept int64
}

func newDeleter(f *Forwarder, out chan<- ackedBatch) *deleter {
	d := &deleter{f: f, more: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), out: out}
	go d.loop()
	return d
}

// add never blocks: the dispatcher hands over ids and moves on.
func (d *deleter) add(ids []int64) {
	d.mu.Lock()
	d.ids = append(d.ids, ids...)
	d.mu.Unlock()
	select {
	case d.more <- struct{}{}:
	default:
	}
}

// close flushes what was added and waits for the loop to end.
func (d *deleter) close() {
	close(d.quit)
	<-d.done
}

func (d *deleter) loop() {
	defer close(d.done)
	for {
		d.mu.Lock()
		ids := d.ids
		d.ids = nil
		d.mu.Unlock()
		if len(ids) > 0 {
			kept := d.complete(ids)
			select {
			case d.out <- ackedBatch{ids: ids, kept: kept}:
			case <-d.quit: // the dispatcher is gone
			}
			continue
		}
		select {
		case <-d.more:
		case <-d.quit:
			d.mu.Lock()
			empty := len(d.ids) == 0
			d.mu.Unlock()
			if empty {
				return
			}
		}
	}
}

// complete retries until the rows are gone or CloseTimeout passed; rows it
// cannot delete stay in the outbox and are published again later (at least
// once). It returns the lowest id of those, or zero.
func (d *deleter) complete(ids []int64) (kept int64) {
	f := d.f
	deadline := time.Now().Add(max(f.cfg.CloseTimeout, time.Second))
	delay := 50 * time.Millisecond
	for start := 0; start < len(ids); {
		end := min(start+deleteChunk, len(ids))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := f.cfg.Dialect.CompleteForwarded(ctx, f.cfg.DB, ids[start:end], f.cfg.KeepForwarded)
		cancel()
		if err == nil {
			start = end
			continue
		}
		f.reportError(err)
		if time.Now().After(deadline) {
			f.cfg.Logger.Error("millbox forwarder: cannot remove published rows; they will be published again", err,
				watermill.LogFields{"rows": end - start})
			for _, id := range ids[start:end] {
				if kept == 0 || id < kept {
					kept = id
				}
			}
			start = end
			continue
		}
		f.cfg.Logger.Error("millbox forwarder: removing published rows failed; retrying", err, nil)
		time.Sleep(delay)
		delay = min(2*delay, 2*time.Second)
	}
	return kept
}
