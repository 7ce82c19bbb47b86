package wake

import (
	"sync"
	"time"
)

var wakers sync.Map // table -> *wakeSet

type wakeSet struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

// Rows pings the forwarders of table in this process: rows were written.
func Rows(table string) {
	v, ok := wakers.Load(table)
	if !ok {
		return
	}
	ws := v.(*wakeSet)
	ws.mu.Lock()
	for ch := range ws.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	ws.mu.Unlock()
}

// SubscribeRows returns a channel that receives a value after writes to
// table, and a function that unsubscribes.
func SubscribeRows(table string) (<-chan struct{}, func()) {
	v, _ := wakers.LoadOrStore(table, &wakeSet{subs: map[chan struct{}]struct{}{}})
	ws := v.(*wakeSet)
	ch := make(chan struct{}, 1)
	ws.mu.Lock()
	ws.subs[ch] = struct{}{}
	ws.mu.Unlock()
	return ch, func() {
		ws.mu.Lock()
		delete(ws.subs, ch)
		ws.mu.Unlock()
	}
}

var dueWakers sync.Map // table -> *dueSet

type dueSet struct {
	mu   sync.Mutex
	subs map[*DueSub]struct{}
}

// DueSub is one forwarder's subscription: the earliest due time reported
// since it last looked, and a channel that signals a report.
type DueSub struct {
	mu       sync.Mutex
	earliest time.Time
	ch       chan struct{}
}

// C receives a value after each report.
func (s *DueSub) C() <-chan struct{} { return s.ch }

// Due tells the forwarders of table in this process that a message
// written to its scheduled table is due at t.
func Due(table string, t time.Time) {
	v, ok := dueWakers.Load(table)
	if !ok {
		return
	}
	ds := v.(*dueSet)
	ds.mu.Lock()
	for s := range ds.subs {
		s.mu.Lock()
		if s.earliest.IsZero() || t.Before(s.earliest) {
			s.earliest = t
		}
		s.mu.Unlock()
		select {
		case s.ch <- struct{}{}:
		default:
		}
	}
	ds.mu.Unlock()
}

// SubscribeDue returns a subscription to the due times written to table,
// and a function that ends it.
func SubscribeDue(table string) (*DueSub, func()) {
	v, _ := dueWakers.LoadOrStore(table, &dueSet{subs: map[*DueSub]struct{}{}})
	ds := v.(*dueSet)
	s := &DueSub{ch: make(chan struct{}, 1)}
	ds.mu.Lock()
	ds.subs[s] = struct{}{}
	ds.mu.Unlock()
	return s, func() {
		ds.mu.Lock()
		delete(ds.subs, s)
		ds.mu.Unlock()
	}
}

// Take returns the earliest due time reported since the last take, zero
// when none was.
func (s *DueSub) Take() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.earliest
	s.earliest = time.Time{}
	return t
}
