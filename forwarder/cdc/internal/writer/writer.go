package writer

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
)

// Job is one write.
type Job struct {
	// Write writes, and returns the writing transaction's id.
	Write func(ctx context.Context) (xid uint32, err error)
	// Messages counts what it writes, for the logs.
	Messages int
	// Retry: tried again until written or the forwarder stops (messages
	// that only wait); else tried once (a failed attempt, which the
	// engine retries its own way).
	Retry bool
	// Done is handed the outcome through the Writer's Do.
	Done func(xid uint32, err error)
}

// Writer runs Jobs one after the other, in the order they came.
type Writer struct {
	do          func(func()) bool // runs a function on the engine's loop
	reportError func(error)
	logger      watermill.LoggerAdapter
	mu          sync.Mutex
	jobs        []Job
	more        chan struct{}
	quit        chan struct{}
	done        chan struct{}
}

// New returns a writer that hands each outcome to do (false once the
// engine has stopped) and reports the errors it retries.
func New(do func(func()) bool, reportError func(error), logger watermill.LoggerAdapter) *Writer {
	return &Writer{do: do, reportError: reportError, logger: logger, more: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// Add queues a job; it never blocks the loop.
func (w *Writer) Add(j Job) {
	w.mu.Lock()
	w.jobs = append(w.jobs, j)
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default:
	}
}

// Run does the jobs until ctx ends and no job is left: jobs queued while
// the forwarder stops fail at once (their messages are not confirmed on
// the slot, and the next reader streams them again).
func (w *Writer) Run(ctx context.Context) {
	defer close(w.done)
	for {
		w.mu.Lock()
		var j Job
		have := len(w.jobs) > 0
		if have {
			j = w.jobs[0]
			w.jobs[0] = Job{}
			w.jobs = w.jobs[1:]
		}
		w.mu.Unlock()
		if have {
			xid, err := w.write(ctx, j)
			if !w.do(func() { j.Done(xid, err) }) {
				return
			}
			continue
		}
		select {
		case <-w.more:
		case <-w.quit:
			return
		}
	}
}

// Stop ends Run once the engine has stopped.
func (w *Writer) Stop() {
	close(w.quit)
	<-w.done
}

func (w *Writer) write(ctx context.Context, j Job) (uint32, error) {
	backoff := retry.Backoff{Policy: retry.Operations}
	for {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		xid, err := j.Write(wctx)
		cancel()
		if err == nil || !j.Retry || ctx.Err() != nil {
			return xid, err
		}
		w.reportError(err)
		delay := backoff.Next(err)
		w.logger.Error("millbox cdc: cannot write messages of publishers without a table into the outbox; retrying", err,
			watermill.LogFields{"messages": j.Messages, "retry_in": delay.String()})
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(delay):
		}
	}
}
