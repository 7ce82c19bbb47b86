package fleet

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// budget bounds the connections this instance holds to tenant servers:
// MaxConns in all, MaxConnsPerServer to one. A place is taken when a
// connection is dialled and given back when it is closed, so the bound is
// on physical connections, whatever pools the drivers keep.
type budget struct {
	all     chan struct{}
	mu      sync.Mutex
	servers map[string]chan struct{}
	per     int
	open    atomic.Int64 // connections open now
	dialer  net.Dialer
}

func newBudget(maxConns, perServer int) *budget {
	return &budget{
		all:     make(chan struct{}, maxConns),
		servers: map[string]chan struct{}{},
		per:     perServer,
		dialer:  net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second},
	}
}

func (b *budget) server(name string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := b.servers[name]
	if ch == nil {
		ch = make(chan struct{}, b.per)
		b.servers[name] = ch
	}
	return ch
}

// dial returns the DialFunc of server's connections: it waits for a place
// in both bounds (until ctx ends) before it dials. The server's place is
// taken first: a dial waiting for its server, which is full, must not
// hold a place of the instance-wide bound meanwhile, or the dials queued
// on one busy server would starve the connections of every other server.
func (b *budget) dial(server string) DialFunc {
	per := b.server(server)
	return func(ctx context.Context, network, address string) (net.Conn, error) {
		select {
		case per <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		select {
		case b.all <- struct{}{}:
		case <-ctx.Done():
			<-per
			return nil, ctx.Err()
		}
		release := sync.OnceFunc(func() {
			<-per
			<-b.all
			b.open.Add(-1)
		})
		b.open.Add(1)
		c, err := b.dialer.DialContext(ctx, network, address)
		if err != nil {
			release()
			return nil, err
		}
		return &budgetConn{Conn: c, release: release}, nil
	}
}

// free dials connections that are not counted: a doorbell's own.
func (b *budget) free(ctx context.Context, network, address string) (net.Conn, error) {
	return b.dialer.DialContext(ctx, network, address)
}

// budgetConn gives its place back when it is closed.
type budgetConn struct {
	net.Conn
	release func()
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}
