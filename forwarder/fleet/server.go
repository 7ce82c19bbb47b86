package fleet

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/sqladapters"
)

// server is one of Config.Servers as the loop keeps it: its open
// databases, shared by the tenants that may share them, and its doorbell.
type server struct {
	name    string
	s       Server
	handles map[*handle]bool

	// the doorbell's, guarded by mu
	mu       sync.Mutex
	watching []Tenant
	cancel   context.CancelFunc
	done     chan struct{}
}

// handle is an open database of a server and the tenants using it.
type handle struct {
	srv  *server
	rep  Tenant // the first tenant it was opened for
	refs int    // the loop's

	once sync.Once
	h    Handle
	err  error
	dial DialFunc
	idle time.Duration
}

// acquire returns the handle t uses: one already open for a tenant of the
// same database, or a new one. The loop's.
func (s *server) acquire(f *Fleet, t Tenant) *handle {
	for h := range s.handles {
		if s.s.SameDatabase(h.rep, t) {
			h.refs++
			return h
		}
	}
	h := &handle{srv: s, rep: t, refs: 1, dial: f.budget.dial(s.name), idle: f.cfg.MinHold}
	s.handles[h] = true
	return h
}

// releaseHandle drops a reference; the last one closes the handle. The
// loop's.
func (s *server) releaseHandle(h *handle) {
	h.refs--
	if h.refs > 0 {
		return
	}
	delete(s.handles, h)
	go func() {
		h.once.Do(func() {}) // a handle never opened stays closed
		if h.h != nil {
			h.h.Close()
		}
	}()
}

// db opens the handle on first use.
func (h *handle) db(ctx context.Context) (sqladapters.DB, error) {
	h.once.Do(func() {
		h.h, h.err = h.srv.s.Open(ctx, h.rep.Database, h.dial, h.idle)
	})
	if h.err != nil {
		return nil, h.err
	}
	return h.h.DB(), nil
}

// setTenants gives the doorbell the tenants it watches now, and starts or
// stops it as the server comes to have tenants or has none left.
func (s *server) setTenants(f *Fleet, ts []Tenant) {
	bell := s.s.Doorbell()
	s.mu.Lock()
	s.watching = ts
	running := s.cancel != nil
	s.mu.Unlock()
	switch {
	case bell == nil:
	case len(ts) > 0 && !running:
		ctx, cancel := context.WithCancel(context.Background())
		s.mu.Lock()
		s.cancel, s.done = cancel, make(chan struct{})
		done := s.done
		s.mu.Unlock()
		go func() {
			defer close(done)
			s.watch(ctx, f, bell)
		}()
	case len(ts) == 0 && running:
		s.stopDoorbell()
	}
}

func (s *server) stopDoorbell() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.cancel, s.done = nil, nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// watch runs the doorbell until ctx ends, again after a failure (with
// backoff); after a failure the server's tenants are all looked at, as
// the doorbell may have missed rings meanwhile.
func (s *server) watch(ctx context.Context, f *Fleet, bell Doorbell) {
	backoff := retry.Backoff{Policy: retry.Operations}
	logger := f.cfg.Logger.With(watermill.LogFields{"server": s.name})
	var lastLog time.Time
	for ctx.Err() == nil {
		err := bell.Watch(ctx, Watch{
			Tenants: func() []Tenant {
				s.mu.Lock()
				defer s.mu.Unlock()
				return s.watching
			},
			Ring:   f.ring,
			Gap:    func() { f.gap(s) },
			Dial:   f.budget.free,
			Logger: logger,
		})
		if ctx.Err() != nil {
			return
		}
		wait := backoff.Next(err)
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			logger.Error("millbox fleet: doorbell stopped; looking at the server's tenants meanwhile", err,
				watermill.LogFields{"retry_in": wait.String()})
		}
		f.gap(s)
		sleep(ctx, wait)
	}
}

// gap looks at every idle tenant of s: its doorbell may have missed rings.
func (f *Fleet) gap(s *server) {
	f.do(func() {
		for _, t := range f.tenants {
			if t.srv == s && t.state == idle && f.mayStart(t) {
				f.start(t, false)
			}
		}
	})
}

// stopDoorbells stops every doorbell; the loop has ended.
func (f *Fleet) stopDoorbells() {
	for _, s := range f.servers {
		s.stopDoorbell()
	}
}
