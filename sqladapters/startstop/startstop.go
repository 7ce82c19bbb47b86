package startstop

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

var (
	// ErrClosed is returned by a component after Close: by Begin, by
	// Ready, and by the components' own methods (a closed publisher, a
	// closed destination). sqladapters, forwarder, forwarder/destination
	// and inbox re-export it, so errors.Is(err, forwarder.ErrClosed) and
	// the others all match it.
	ErrClosed = errors.New("millbox: closed")
	// ErrRunning is returned by Begin while a Run of the same component
	// is going on.
	ErrRunning = errors.New("millbox: already running")
	// ErrInvalidConfig is returned by every millbox constructor for a bad
	// config; the error names the field and the rule. sqladapters,
	// forwarder, forwarder/destination, inbox and middleware re-export it.
	ErrInvalidConfig = errors.New("millbox: invalid config")
)

// Base is the lifecycle of one component. Its zero value is ready to use;
// it must not be copied after first use. A component's Run calls Begin
// first and End last, and Started once it runs; Running, Ready and Close
// are the component's methods of those names.
type Base struct {
	mu      sync.Mutex
	init    bool
	started bool
	closed  bool
	cancel  context.CancelFunc
	running chan struct{}
	done    chan struct{}
	once    sync.Once
	err     error // set before done is closed
}

func (b *Base) lazyInit() {
	if !b.init {
		b.init = true
		b.running = make(chan struct{})
		b.done = make(chan struct{})
	}
}

// Begin starts a Run: it returns the context Run works with, which ends
// when ctx does or Close is called, or ErrClosed after Close, or
// ErrRunning when Run was called before.
func (b *Base) Begin(ctx context.Context) (context.Context, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lazyInit()
	switch {
	case b.closed:
		return nil, ErrClosed
	case b.started:
		return nil, ErrRunning
	}
	b.started = true
	ctx, b.cancel = context.WithCancel(ctx)
	return ctx, nil
}

// Started reports that Run runs: Running closes and Ready returns nil.
func (b *Base) Started() {
	b.mu.Lock()
	b.lazyInit()
	b.mu.Unlock()
	b.once.Do(func() { close(b.running) })
}

// End reports that Run returns err and returns it: whoever waits on
// Running or Ready is released, and Close returns.
func (b *Base) End(err error) error {
	b.mu.Lock()
	cancel := b.cancel
	b.mu.Unlock()
	cancel()
	b.err = err
	close(b.done)
	b.once.Do(func() { close(b.running) })
	return err
}

// Running is closed once the component runs, or once Run has returned,
// whichever comes first: a caller waiting on it never hangs on a
// component that could not start. Ready tells the two apart.
func (b *Base) Running() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lazyInit()
	return b.running
}

// Ready waits until the component runs and returns nil, or returns why it
// will not: the error Run returned, ErrClosed when it stopped,
// or ctx's error.
func (b *Base) Ready(ctx context.Context) error {
	running := b.Running()
	select {
	case <-running:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-b.done:
		if b.err != nil {
			return b.err
		}
		return ErrClosed
	default:
		return nil
	}
}

// Close stops Run and waits up to timeout for it to return; what names
// the component in the error of a timeout. Close is idempotent, and a
// component that never ran closes at once.
func (b *Base) Close(timeout time.Duration, what string) error {
	b.mu.Lock()
	b.lazyInit()
	b.closed = true
	started, cancel := b.started, b.cancel
	b.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-b.done:
		return nil
	case <-t.C:
		return fmt.Errorf("millbox: %s did not stop within CloseTimeout %v", what, timeout)
	}
}
