package exampleenv

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/millbox/millbox/forwarder"
)

// StartForwarder runs fw.Run(ctx) in a goroutine of its own and waits
// until the forwarder is running, so that an error that stops it from
// starting (unreachable database, missing tables) is returned here rather
// than leaving the example waiting for events that never come.
//
// stop closes fw, which finishes or releases the rows in flight, waits for
// Run to return and reports its error, if any, on standard error. It may
// be called more than once; a deferred stop then does nothing after an
// explicit one.
func StartForwarder(ctx context.Context, fw *forwarder.Forwarder) (stop func(), err error) {
	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx) }()
	// Ready returns once the forwarder holds its partitions of the
	// outbox, or with the error that stopped Run.
	if err := fw.Ready(ctx); err != nil {
		return nil, fmt.Errorf("forwarder: %w", err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = fw.Close()
			if err := <-done; err != nil {
				fmt.Fprintln(os.Stderr, "forwarder:", err)
			}
		})
	}, nil
}
