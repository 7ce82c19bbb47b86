package integration_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/integration/testenv"
)

// freezingProxy relays TCP connections to a server until it is frozen;
// from then on the server's bytes are held back, as from a server that
// hangs. The caller closes it.
type freezingProxy struct {
	ln     net.Listener
	target string
	frozen chan struct{}
	once   sync.Once

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func startFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln, target: target, frozen: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p
}

func (p *freezingProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, server)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(server, client)
		}()
		go func() {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					select {
					case <-p.frozen:
						return
					default:
					}
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

// freeze holds back everything the server sends from now on.
func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

func (p *freezingProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestAMQPBatchDeadline: amqpbatch gives a call up at its context's
// deadline (the forwarder's PublishTimeout), not at a longer
// ConfirmTimeout, when the broker stops answering: while opening a channel,
// and while waiting for confirmations on an open one. The error names the
// deadline and wraps destination.ErrDestinationUnavailable.
func TestAMQPBatchDeadline(t *testing.T) {
	rabbit := testenv.RequireAMQP(t)
	queue := testenv.AMQPQueue(t)
	u, err := url.Parse(rabbit)
	if err != nil {
		t.Fatal(err)
	}
	for _, warm := range []bool{false, true} {
		name := "opening a channel"
		if warm {
			name = "waiting for confirmations"
		}
		t.Run(name, func(t *testing.T) {
			pub, err := func() (*amqpbatch.Publisher, error) {
				proxy := startFreezingProxy(t, u.Host)
				via := *u
				via.Host = proxy.ln.Addr().String()
				// No heartbeats: a wait for the frozen broker lasts until
				// the proxy closes, not until the client misses them.
				via.RawQuery = "heartbeat=0"
				pub, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: via.String(), ConfirmTimeout: time.Hour})
				if err != nil {
					return nil, err
				}
				// Closed after the proxy (cleanups run last first): a
				// connection's close waits for the broker's answer.
				t.Cleanup(func() { _ = pub.Close() })
				t.Cleanup(proxy.close)
				if warm {
					// A channel in the pool, so the call only waits for
					// its confirmation.
					if err := pub.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte("warm"))); err != nil {
						return nil, err
					}
				}
				proxy.freeze()
				return pub, nil
			}()
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(300 * time.Millisecond)
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			defer cancel()
			msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
			msg.SetContext(ctx)
			done := make(chan error, 1)
			go func() { done <- pub.Publish(queue, msg) }()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("Publish did not return within a minute of its deadline")
			}
			t.Logf("returned %v after the deadline: %v", time.Since(deadline), err)
			if !errors.Is(err, destination.ErrDestinationUnavailable) || destination.DeliveredPrefix(err, 1) != 0 || !strings.Contains(err.Error(), "the call's deadline") {
				t.Fatalf("publish to a broker that stopped answering: %v", err)
			}
			if time.Now().Before(deadline) {
				t.Fatalf("returned before the deadline, with no answer from the broker: %v", err)
			}
		})
	}
}
