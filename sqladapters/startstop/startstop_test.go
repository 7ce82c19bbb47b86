package startstop_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/startstop"
)

// component is the smallest user of Base: Run waits for its context, or
// fails at once with fail.
type component struct {
	life startstop.Base
	fail error
}

func (c *component) Run(ctx context.Context) error {
	ctx, err := c.life.Begin(ctx)
	if err != nil {
		return err
	}
	if c.fail != nil {
		return c.life.End(c.fail)
	}
	c.life.Started()
	<-ctx.Done()
	return c.life.End(nil)
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	c := &component{}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	if err := c.life.Ready(ctx); err != nil {
		t.Fatalf("Ready while running: %v", err)
	}
	if err := c.Run(ctx); !errors.Is(err, startstop.ErrRunning) {
		t.Fatalf("second Run: %v, want ErrRunning", err)
	}
	if err := c.life.Close(time.Second, "component"); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("Run after Close: %v", err)
	}
	if err := c.life.Close(time.Second, "component"); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := c.life.Ready(ctx); !errors.Is(err, sqladapters.ErrClosed) {
		t.Fatalf("Ready after Close: %v, want ErrClosed", err)
	}
	if err := c.Run(ctx); !errors.Is(err, sqladapters.ErrClosed) {
		t.Fatalf("Run after Close: %v, want ErrClosed", err)
	}
}

// Whoever waits for readiness is released when Run fails, and learns why.
func TestReadyReportsRunsFailure(t *testing.T) {
	boom := errors.New("boom")
	c := &component{fail: boom}
	if err := c.Run(context.Background()); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	<-c.life.Running()
	if err := c.life.Ready(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Ready = %v, want the error Run returned", err)
	}
}

func TestCloseBeforeRun(t *testing.T) {
	var c component
	if err := c.life.Close(time.Second, "component"); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, sqladapters.ErrClosed) {
		t.Fatalf("Run after Close: %v", err)
	}
}

// A Run that does not return within the timeout makes Close say so.
func TestCloseTimesOut(t *testing.T) {
	var b startstop.Base
	ctx, err := b.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.Started()
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		<-release
		b.End(nil)
		close(done)
	}()
	if err := b.Close(10*time.Millisecond, "slowpoke"); err == nil {
		t.Fatal("Close of a Run that does not return succeeded")
	}
	close(release)
	<-done
}
