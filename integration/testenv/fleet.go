package testenv

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Budget is a dial function for tests of the fleet's drivers (a
// fleet.DialFunc): like the fleet's, it lets at most a given number of
// connections be open at once, a dial waiting for a place until its
// context ends, and gives the place back when the connection closes. It
// remembers every connection's local port, by which the server names
// its client (pg_stat_activity.client_port, the port in
// information_schema.PROCESSLIST.HOST), and every address dialled.
//
// A closed connection's server process takes a moment to go; a budget
// made with a gone function gives the place back only once gone says the
// server lists the port no more, so that the server never lists more
// connections than the budget allows, however fast places change hands.
type Budget struct {
	limit  int
	places chan struct{}
	gone   func(ctx context.Context, port int) (bool, error)

	mu     sync.Mutex
	open   int
	max    int
	ports  map[int]bool // local ports of the connections dialled
	addrs  []string     // every address dialled, reached or not
	failed int
}

// NewBudget returns a budget of limit connections. gone, when not nil,
// tells whether the server still lists a client's port (see Budget).
func NewBudget(limit int, gone func(ctx context.Context, port int) (bool, error)) *Budget {
	return &Budget{limit: limit, places: make(chan struct{}, limit), gone: gone, ports: map[int]bool{}}
}

// Limit returns the number of connections the budget allows at once.
func (b *Budget) Limit() int { return b.limit }

// Dial takes a place (waiting until ctx ends) and dials; the place is
// given back when the connection closes, or at once if the dial fails.
func (b *Budget) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	select {
	case b.places <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addrs = append(b.addrs, addr)
	if err != nil {
		b.failed++
		<-b.places
		return nil, err
	}
	port := 0
	if tcp, ok := c.LocalAddr().(*net.TCPAddr); ok {
		port = tcp.Port
		b.ports[port] = true
	}
	b.open++
	b.max = max(b.max, b.open)
	return &budgetConn{Conn: c, b: b, port: port}, nil
}

// Open returns the number of connections open now.
func (b *Budget) Open() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// Max returns the most connections that were open at once.
func (b *Budget) Max() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.max
}

// Dialled tells whether a connection from local port went through Dial.
func (b *Budget) Dialled(port int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ports[port]
}

// Addrs returns every address dialled, and how many dials failed.
func (b *Budget) Addrs() (addrs []string, failed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.addrs...), b.failed
}

type budgetConn struct {
	net.Conn
	b    *Budget
	port int
	once sync.Once
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.b.waitGone(c.port)
		c.b.mu.Lock()
		c.b.open--
		c.b.mu.Unlock()
		<-c.b.places
	})
	return err
}

// waitGone waits, for at most 10 s, until the server lists port no more.
func (b *Budget) waitGone(port int) {
	if b.gone == nil || port == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if gone, err := b.gone(ctx, port); err == nil && gone {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ServerConns watches the connections a server lists for a fleet's
// driver while a test runs: every few milliseconds, list returns the
// local ports of the clients the server has for it (by application_name
// or user), and ServerConns checks that each went through budget and
// that they are no more than the budget's limit (which holds when the
// budget has a gone function).
type ServerConns struct {
	t      testing.TB
	budget *Budget
	stop   chan struct{}
	done   chan struct{}

	mu       sync.Mutex
	max      int
	samples  int
	problems []string
}

// WatchServerConns starts watching; Stop ends it and reports what broke
// the rules. A failing list is reported too.
func WatchServerConns(t testing.TB, budget *Budget, list func(ctx context.Context) ([]int, error)) *ServerConns {
	w := &ServerConns{t: t, budget: budget, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			ports, err := list(ctx)
			cancel()
			w.check(ports, err)
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { w.Stop() })
	return w
}

func (w *ServerConns) check(ports []int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.problems) > 10 {
		return
	}
	if err != nil {
		w.problems = append(w.problems, "listing the server's connections: "+err.Error())
		return
	}
	w.samples++
	w.max = max(w.max, len(ports))
	for _, p := range ports {
		if !w.budget.Dialled(p) {
			w.problems = append(w.problems, fmt.Sprintf("the server has a connection from port %d that did not go through the dial function", p))
		}
	}
	if len(ports) > w.budget.Limit() {
		w.problems = append(w.problems, fmt.Sprintf("the server has %d connections, more than the budget's %d", len(ports), w.budget.Limit()))
	}
}

// Stop ends the watch (once) and fails the test with what broke the
// rules; it returns the most connections seen at once and how many
// looks were taken.
func (w *ServerConns) Stop() (maxSeen, samples int) {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, p := range w.problems {
		w.t.Error(p)
	}
	w.problems = nil
	return w.max, w.samples
}
