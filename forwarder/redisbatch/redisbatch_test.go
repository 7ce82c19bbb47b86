package redisbatch_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/redisbatch"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := redisbatch.NewPublisher(redisbatch.Config{}); !errors.Is(err, destination.ErrInvalidConfig) || !strings.Contains(err.Error(), "Client") {
		t.Fatalf("no client: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisbatch.NewPublisher(redisbatch.Config{Client: c, Timeout: -1}); !errors.Is(err, destination.ErrInvalidConfig) || !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("negative Timeout: %v", err)
	}
}

// A server nobody listens on is an outage, not a message failure; a
// closed publisher says so.
func TestUnreachableIsUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	p, err := redisbatch.NewPublisher(redisbatch.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	err = p.Publish("stream", msg)
	if !errors.Is(err, destination.ErrDestinationUnavailable) || destination.DeliveredPrefix(err, 1) != 0 {
		t.Fatalf("publish to a closed port: %v", err)
	}
	_ = p.Close()
	if err := p.Publish("stream", msg); !errors.Is(err, destination.ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}

// silentServer accepts connections and never answers, as a server that
// hangs does; it is closed after the test.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// A call ends at its context's deadline (the forwarder's PublishTimeout),
// not at a longer Timeout, when the client lets the deadline reach the
// connection, and says that the server did not answer.
func TestPublishEndsAtTheCallsDeadline(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: silentServer(t), MaxRetries: -1, ContextTimeoutEnabled: true, ReadTimeout: time.Hour, WriteTimeout: time.Hour})
	defer c.Close()
	p, err := redisbatch.NewPublisher(redisbatch.Config{Client: c, Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(300 * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Publish("stream", msg) }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("Publish did not return within a minute of its deadline")
	}
	if !errors.Is(err, destination.ErrDestinationUnavailable) || destination.DeliveredPrefix(err, 1) != 0 || !strings.Contains(err.Error(), "the call's deadline") {
		t.Fatalf("publish to a server that does not answer: %v", err)
	}
	if time.Now().Before(deadline) {
		t.Fatalf("returned before the deadline, with no answer from the server: %v", err)
	}
}
