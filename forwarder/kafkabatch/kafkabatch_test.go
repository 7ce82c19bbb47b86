package kafkabatch_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/kafkabatch"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("no brokers: %v", err)
	}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, DeliveryTimeout: -1}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("negative DeliveryTimeout: %v", err)
	}
	notIdempotent := []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, Options: notIdempotent}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("idempotent writes off: %v", err)
	}
}

func TestTxConfigIsValidated(t *testing.T) {
	brokers := kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}}
	for name, cfg := range map[string]kafkabatch.TxConfig{
		"no TransactionalID":           {Config: brokers},
		"a slash in TransactionalID":   {Config: brokers, TransactionalID: "a/b"},
		"TransactionTimeout below 1s":  {Config: brokers, TransactionalID: "a", TransactionTimeout: time.Millisecond},
		"TransactionTimeout too short": {Config: kafkabatch.Config{Brokers: brokers.Brokers, DeliveryTimeout: time.Minute}, TransactionalID: "a"},
		"no brokers":                   {TransactionalID: "a"},
	} {
		if p, err := kafkabatch.NewTxPublisher(cfg); !errors.Is(err, destination.ErrInvalidConfig) {
			if p != nil {
				_ = p.Close()
			}
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	p, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{Config: brokers, TransactionalID: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish("t", message.NewMessage("u", nil)); !errors.Is(err, kafkabatch.ErrNotTransactional) {
		t.Fatalf("Publish outside a forwarder: %v", err)
	}
}

// silentBroker accepts connections and never answers, as a broker that
// hangs does; it is closed after the test.
func silentBroker(t *testing.T) string {
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

// publishBounded publishes one message whose context ends at deadline
// (none when zero) to a broker that never answers, and returns when
// Publish returned and its error. A Publish that outlives its limit by a
// minute fails the test.
func publishBounded(t *testing.T, cfg kafkabatch.Config, deadline time.Time) (returned time.Time, err error) {
	t.Helper()
	cfg.Brokers = []string{silentBroker(t)}
	p, err := kafkabatch.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	msg := message.NewMessage("m1", []byte("x"))
	msg.SetContext(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Publish("orders", msg) }()
	select {
	case err := <-done:
		return time.Now(), err
	case <-time.After(time.Minute):
		t.Fatal("Publish did not return within a minute of its limit")
		return time.Time{}, nil
	}
}

// A call ends at its context's deadline (the forwarder's PublishTimeout),
// not at a longer DeliveryTimeout, and says that the broker did not answer.
func TestPublishEndsAtTheCallsDeadline(t *testing.T) {
	deadline := time.Now().Add(300 * time.Millisecond)
	returned, err := publishBounded(t, kafkabatch.Config{DeliveryTimeout: time.Hour}, deadline)
	if !errors.Is(err, destination.ErrDestinationUnavailable) || !errors.Is(err, context.DeadlineExceeded) || destination.DeliveredPrefix(err, 1) != 0 {
		t.Fatalf("publish to a broker that does not answer: %v", err)
	}
	if !strings.Contains(err.Error(), "the call's deadline") {
		t.Fatalf("the error does not name the call's deadline: %v", err)
	}
	if returned.Before(deadline) {
		t.Fatalf("returned %v before the deadline, with no answer from the broker: %v", deadline.Sub(returned), err)
	}
}

// A DeliveryTimeout shorter than the call's deadline ends the call first.
func TestPublishEndsAtDeliveryTimeout(t *testing.T) {
	_, err := publishBounded(t, kafkabatch.Config{DeliveryTimeout: 300 * time.Millisecond}, time.Now().Add(time.Hour))
	if !errors.Is(err, destination.ErrDestinationUnavailable) || !strings.Contains(err.Error(), "DeliveryTimeout") {
		t.Fatalf("publish to a broker that does not answer: %v", err)
	}
}
