package polling

import (
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

func TestHorizonChainFinalMark(t *testing.T) {
	var c horizonChain
	// Look 1: mark 10. Its rows belong to transactions older than look
	// 2's xid, 100.
	if got := c.add(sqladapters.Horizon{Mark: 10, XMin: 90, XID: 95}); got != 0 {
		t.Fatalf("after one look: final %d, want 0", got)
	}
	if got := c.add(sqladapters.Horizon{Mark: 20, XMin: 97, XID: 100}); got != 0 {
		t.Fatalf("transaction 97 still runs: final %d, want 0", got)
	}
	// A long transaction (99) holds xmin back: nothing becomes final.
	for i := range 3 {
		if got := c.add(sqladapters.Horizon{Mark: int64(30 + i), XMin: 99, XID: uint64(110 + i)}); got != 0 {
			t.Fatalf("xmin 99 < xid 100: final %d, want 0", got)
		}
	}
	// It ends: the claims whose xid is at most the new xmin are final.
	if got := c.add(sqladapters.Horizon{Mark: 40, XMin: 111, XID: 120}); got != 30 {
		t.Fatalf("xmin 111: final %d, want 30 (claims up to xid 111)", got)
	}
	if got := c.add(sqladapters.Horizon{Mark: 50, XMin: 200, XID: 200}); got != 40 {
		t.Fatalf("xmin 200: final %d, want 40", got)
	}
}

func TestHorizonChainBoundsClaims(t *testing.T) {
	var c horizonChain
	for i := range 3 * maxClaims {
		c.add(sqladapters.Horizon{Mark: int64(i + 1), XMin: 1, XID: uint64(10 + i)})
	}
	if len(c.pending) > maxClaims {
		t.Fatalf("%d claims kept, want at most %d", len(c.pending), maxClaims)
	}
	// Dropping later claims only delays the final mark: it never passes
	// a mark whose transactions may still run.
	if got := c.add(sqladapters.Horizon{Mark: 1000, XMin: 10 + maxClaims, XID: 5000}); got != maxClaims {
		t.Fatalf("final %d, want %d", got, maxClaims)
	}
}

func TestHorizonChainStartsAgainWhenTheSequenceGoesBack(t *testing.T) {
	var c horizonChain
	c.add(sqladapters.Horizon{Mark: 100, XMin: 10, XID: 10})
	if got := c.add(sqladapters.Horizon{Mark: 200, XMin: 20, XID: 20}); got != 100 {
		t.Fatalf("final %d, want 100", got)
	}
	// The sequence restarted (or the table was made again): nothing up
	// to 100 is known any more.
	if got := c.add(sqladapters.Horizon{Mark: 5, XMin: 30, XID: 30}); got != 0 {
		t.Fatalf("after the sequence went back: final %d, want 0", got)
	}
	if got := c.add(sqladapters.Horizon{Mark: 8, XMin: 40, XID: 40}); got != 5 {
		t.Fatalf("final %d, want 5", got)
	}
	// Transaction ids went back (another server): the same.
	if got := c.add(sqladapters.Horizon{Mark: 9, XMin: 3, XID: 4}); got != 0 {
		t.Fatalf("after transaction ids went back: final %d, want 0", got)
	}
}

func TestFloorState(t *testing.T) {
	poll := time.Second
	t0 := time.Unix(1000, 0)
	rows := func(ids ...int64) []sqladapters.OutboxRow {
		var out []sqladapters.OutboxRow
		for _, id := range ids {
			out = append(out, sqladapters.OutboxRow{ID: id})
		}
		return out
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	s := floorState{on: true}
	if head, after := s.next(nil, t0, poll); !head || after != 0 {
		t.Fatalf("first read: head %v after %d, want a head read", head, after)
	}
	s.headRead(sqladapters.Horizon{Mark: 100, XMin: 5, XID: 5}, nil, sqladapters.Horizon{Mark: 100, XMin: 5, XID: 6})
	if s.floor != 0 {
		t.Fatalf("after one head read: floor %d, want 0 (nothing is final yet)", s.floor)
	}
	// Until the next head read, reads start at the first row without a
	// look; with nothing final yet, that head read comes soon.
	if head, after := s.next(nil, at(10*time.Millisecond), poll); head || after != 0 {
		t.Fatalf("10 ms later, floor 0: head %v after %d, want a plain read", head, after)
	}
	// The next head read's first look makes mark 100 final; the first
	// pending row is 60.
	if head, _ := s.next(nil, at(firstLooks), poll); !head {
		t.Fatal("nothing final yet and firstLooks passed: want a head read")
	}
	s.headRead(sqladapters.Horizon{Mark: 120, XMin: 9, XID: 9}, rows(60, 61), sqladapters.Horizon{Mark: 120, XMin: 9, XID: 10})
	if s.floor != 59 {
		t.Fatalf("floor %d, want 59 (below the first pending row)", s.floor)
	}
	if head, after := s.next(nil, at(time.Second+20*time.Millisecond), poll); head || after != 59 {
		t.Fatalf("within the poll interval: head %v after %d, want a read after 59", head, after)
	}
	// A row of a lane given up is pending again: the floor goes below it.
	s.handedBack(40)
	if _, after := s.next(nil, at(time.Second+30*time.Millisecond), poll); after != 39 {
		t.Fatalf("after a row handed back: read after %d, want 39", after)
	}
	// A head read: rows handed back while it runs bound the floor it sets.
	if head, _ := s.next(nil, at(2*time.Second), poll); !head {
		t.Fatal("a poll interval passed: want a head read")
	}
	s.handedBack(70)
	s.headRead(sqladapters.Horizon{Mark: 130, XMin: 20, XID: 20}, rows(90), sqladapters.Horizon{Mark: 130, XMin: 20, XID: 21})
	if s.floor != 69 {
		t.Fatalf("floor %d, want 69 (a row handed back during the head read)", s.floor)
	}
	// A row waiting for a retry bounds it, seen before the read or after.
	s.next(nil, at(4*time.Second), poll)
	s.headRead(sqladapters.Horizon{Mark: 140, XMin: 30, XID: 30, RetryMin: 80}, rows(200), sqladapters.Horizon{Mark: 140, XMin: 30, XID: 31})
	if s.floor != 79 {
		t.Fatalf("floor %d, want 79 (below the retry seen before the read)", s.floor)
	}
	s.next(nil, at(6*time.Second), poll)
	s.headRead(sqladapters.Horizon{Mark: 150, XMin: 40, XID: 40}, nil, sqladapters.Horizon{Mark: 150, XMin: 40, XID: 41, RetryMin: 75})
	if s.floor != 74 {
		t.Fatalf("floor %d, want 74 (below the retry seen after the read)", s.floor)
	}
	// The final mark bounds it: as of the look before the read, not after.
	s.next(nil, at(8*time.Second), poll)
	s.headRead(sqladapters.Horizon{Mark: 160, XMin: 41, XID: 50}, nil, sqladapters.Horizon{Mark: 170, XMin: 60, XID: 60})
	if s.floor != 150 {
		t.Fatalf("floor %d, want 150 (final as of the first look)", s.floor)
	}
	// Other partitions: the floor is not theirs.
	if head, after := s.next([]int{1, 2}, at(8*time.Second+time.Millisecond), poll); !head || after != 0 {
		t.Fatalf("owned partitions changed: head %v after %d, want a head read", head, after)
	}
}

func TestFloorStateOff(t *testing.T) {
	s := floorState{}
	if head, after := s.next(nil, time.Now(), time.Second); head || after != 0 {
		t.Fatalf("without a horizon: head %v after %d, want plain reads", head, after)
	}
}

// TestFloorStateHolds: with dead letters holding their keys, the lowest
// of them bounds the floor, seen before the read or after, so the rows
// its key holds, and the dead letter requeued under its id, are read
// above it; without the option a dead letter bounds nothing.
func TestFloorStateHolds(t *testing.T) {
	poll := time.Second
	t0 := time.Unix(1000, 0)
	for _, holds := range []bool{true, false} {
		s := floorState{on: true, holds: holds}
		s.next(nil, t0, poll)
		s.headRead(sqladapters.Horizon{Mark: 100, XMin: 5, XID: 5}, nil, sqladapters.Horizon{Mark: 100, XMin: 5, XID: 6})
		s.next(nil, t0.Add(poll), poll)
		s.headRead(sqladapters.Horizon{Mark: 120, XMin: 9, XID: 9, HoldMin: 40}, nil, sqladapters.Horizon{Mark: 120, XMin: 9, XID: 10, HoldMin: 40})
		want := map[bool]int64{true: 39, false: 100}[holds]
		if s.floor != want {
			t.Fatalf("holds %v: floor %d with a dead letter 40 holding its key, want %d", holds, s.floor, want)
		}
		s.next(nil, t0.Add(2*poll), poll)
		s.headRead(sqladapters.Horizon{Mark: 130, XMin: 20, XID: 20}, nil, sqladapters.Horizon{Mark: 130, XMin: 20, XID: 21, HoldMin: 45})
		want = map[bool]int64{true: 44, false: 120}[holds]
		if s.floor != want {
			t.Fatalf("holds %v: floor %d with a dead letter 45 seen after the read, want %d", holds, s.floor, want)
		}
	}
}
