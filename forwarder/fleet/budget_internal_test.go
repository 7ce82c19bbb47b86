package fleet

import (
	"context"
	"net"
	"testing"
	"time"
)

// A server whose places are all taken, with dials waiting for it, leaves
// the instance-wide places that are free to the other servers.
func TestBudgetFullServerDoesNotStarveOthers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	b := newBudget(3, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	held, err := b.dial("a")(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// Two dials wait for server a's only place.
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	waiting := make(chan error, 2)
	for range 2 {
		go func() {
			c, err := b.dial("a")(waitCtx, "tcp", ln.Addr().String())
			if err == nil {
				c.Close()
			}
			waiting <- err
		}()
	}
	time.Sleep(100 * time.Millisecond)
	bctx, bcancel := context.WithTimeout(ctx, time.Second)
	defer bcancel()
	c, err := b.dial("b")(bctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("server b could not dial while server a was full: %v", err)
	}
	c.Close()
	stopWaiting()
	for range 2 {
		if err := <-waiting; err == nil {
			t.Fatal("a dial of the full server a succeeded")
		}
	}
	if n := b.open.Load(); n != 1 {
		t.Fatalf("%d connections counted open, want 1", n)
	}
}
