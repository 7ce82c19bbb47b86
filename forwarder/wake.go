package forwarder

import "sync"

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
