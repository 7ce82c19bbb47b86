package startstop_test

import (
	"context"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters/startstop"
)

// ticker is a long-running component with the lifecycle of the forwarder
// and the inbox cleaner.
type ticker struct {
	life startstop.Base
	tick time.Duration
}

func (t *ticker) Run(ctx context.Context) error {
	ctx, err := t.life.Begin(ctx)
	if err != nil {
		return err
	}
	t.life.Started()
	for {
		select {
		case <-ctx.Done():
			return t.life.End(nil)
		case <-time.After(t.tick):
		}
	}
}

func (t *ticker) Ready(ctx context.Context) error { return t.life.Ready(ctx) }
func (t *ticker) Close() error                    { return t.life.Close(time.Second, "ticker") }

func Example() {
	t := &ticker{tick: time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- t.Run(context.Background()) }()
	fmt.Println("ready:", t.Ready(context.Background()))
	fmt.Println("close:", t.Close())
	fmt.Println("run returned:", <-done)
	fmt.Println("run again:", t.Run(context.Background()))
	fmt.Println("ready after close:", t.Ready(context.Background()))
	// Output:
	// ready: <nil>
	// close: <nil>
	// run returned: <nil>
	// run again: millbox: closed
	// ready after close: millbox: closed
}
