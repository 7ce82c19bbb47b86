package forwarder

import (
	"sync"
	"time"
)

// In-process wakeups: a Publisher pings forwarders of the same outbox table
// in the same process, so databases without notifications (MySQL, SQLite)
// still forward with low latency when publisher and forwarder share a
// process. The ping comes before commit, so a woken forwarder may find
// nothing yet; it then looks again shortly after (see Forwarder).
var wakers sync.Map // table -> *wakeSet

type wakeSet struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func wake(table string) {
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

// subscribeWake returns a channel that receives a value after writes to
// table, and a function that unsubscribes.
func subscribeWake(table string) (<-chan struct{}, func()) {
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

// In-process due times: a Publisher that stores scheduled messages tells
// the forwarders of the same outbox table in the same process the earliest
// due time it wrote, so they move the messages at that time rather than at
// their next look at the scheduled table.
var dueWakers sync.Map // table -> *dueSet

type dueSet struct {
	mu   sync.Mutex
	subs map[*dueSub]struct{}
}

// dueSub is one forwarder's subscription: the earliest due time reported
// since it last looked, and a channel that signals a report.
type dueSub struct {
	mu       sync.Mutex
	earliest time.Time
	ch       chan struct{}
}

func wakeAt(table string, t time.Time) {
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

// subscribeDue returns a subscription to the due times written to table,
// and a function that ends it.
func subscribeDue(table string) (*dueSub, func()) {
	v, _ := dueWakers.LoadOrStore(table, &dueSet{subs: map[*dueSub]struct{}{}})
	ds := v.(*dueSet)
	s := &dueSub{ch: make(chan struct{}, 1)}
	ds.mu.Lock()
	ds.subs[s] = struct{}{}
	ds.mu.Unlock()
	return s, func() {
		ds.mu.Lock()
		delete(ds.subs, s)
		ds.mu.Unlock()
	}
}

// take returns the earliest due time reported since the last take, zero
// when none was.
func (s *dueSub) take() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.earliest
	s.earliest = time.Time{}
	return t
}
