package polling

import (
	"math"
	"slices"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// A forwarder deletes the rows it published, but the database keeps their
// entries in the outbox's primary key until vacuum removes them, and a
// read in id order walks every one of them before it reaches the first
// pending row:
// after a few million rows drained between two vacuums, that is tens of
// milliseconds per read. Where the dialect reports a Horizon, the
// forwarder reads past them instead (PendingQuery.After), starting after
// its floor: an id up to which no row is pending or can become pending
// without this forwarder knowing.
//
// The floor is set by a head read, one that starts at the first row and
// is preceded by a look at the horizon and followed by another; one runs
// every PollInterval, so a row below the floor that becomes pending after
// all (a dead letter requeued by an operator moves back under its old id)
// waits no longer than a poll.
// The floor is the lowest of:
//
//   - the final mark as of the first look: ids up to it belong to
//     transactions that had all ended before the read's snapshot (see
//     horizonChain), so none of their rows can still appear;
//   - one below the head read's first row: the read returns the lowest
//     pending ids first, so none is left below it but rows in flight here;
//   - one below the lowest row waiting for a retry, in either look: such a
//     row, and the later rows of its key it holds back, become due without
//     a new insert (the second look catches a failure recorded during the
//     read, by an instance whose lease on the partition just ran out);
//   - with Config.DeadLetterHoldsKey, one below the lowest dead letter
//     holding its key, in either look: the key's later rows, which the
//     reads leave out meanwhile, become due when it is requeued (back
//     under its own id) or discarded, and must be read in id order from
//     it. A key held for long keeps the floor there: reads then walk
//     the index entries from it, as where the dialect reports no
//     horizon;
//   - one below every row this forwarder handed back to the outbox since
//     the head read started (a failed attempt, a lane given up, a delete
//     given up): they are pending again.
//
// Rows handed back later lower the floor at once; a change of the owned
// partitions sets it to zero and makes the next read a head read. Until a
// head read sets it, the floor is zero: reads start at the first row, as
// they do where the dialect reports no horizon; head reads then run every
// firstLooks instead of every PollInterval.

// horizonChain turns successive Horizons into the final mark: the highest
// id up to which every row's transaction has ended.
//
// One look's Mark was read before the next look took its XID, and every
// row up to Mark belongs to a transaction that had an id before its row
// id was drawn, so before that XID. Once a later look's XMin (the oldest
// transaction still running) is at or past that XID, all of them ended.
type horizonChain struct {
	looked  bool
	prev    int64   // the previous look's Mark
	prevXID uint64  // the previous look's XID
	pending []claim // marks waiting for their transactions to end
	final   int64
}

// claim says: every row up to mark belongs to a transaction with an id
// below xid.
type claim struct {
	mark int64
	xid  uint64
}

// maxClaims bounds the claims kept while a long transaction holds XMin
// back; later looks' claims are dropped meanwhile, which only delays the
// final mark.
const maxClaims = 64

// add records one look and returns the final mark. A sequence that went
// back (restarted, the table recreated) or transaction ids that did (a
// different server after a failover) void everything known: the chain
// starts again from this look.
func (c *horizonChain) add(h sqladapters.Horizon) int64 {
	if c.looked && (h.Mark < c.prev || h.XID <= c.prevXID) {
		*c = horizonChain{}
	}
	if c.looked && len(c.pending) < maxClaims {
		c.pending = append(c.pending, claim{mark: c.prev, xid: h.XID})
	}
	c.looked, c.prev, c.prevXID = true, h.Mark, h.XID
	c.pending = slices.DeleteFunc(c.pending, func(cl claim) bool {
		if h.XMin >= cl.xid {
			c.final = max(c.final, cl.mark)
			return true
		}
		return false
	})
	return c.final
}

// firstLooks is how often head reads run while no mark is final yet (at
// start, after the sequence went back, while a transaction running since
// the start holds XMin back): the floor needs two looks, and waiting a
// PollInterval for the second would leave the first second of every run
// to reads from the first row.
const firstLooks = 100 * time.Millisecond

// floorState is the dispatcher's part of the above.
type floorState struct {
	on       bool // the dialect reports a horizon
	holds    bool // dead letters hold their keys (Config.DeadLetterHoldsKey)
	floor    int64
	chain    horizonChain
	lastHead time.Time
	owned    []int // the partitions of the last head read (nil: all)
	returned int64 // lowest id handed back since the head read in flight started, less one

	lookErrLogged time.Time // when a failed look was last logged
}

// next tells whether the read about to start is a head read and where it
// starts. owned is what the read covers.
func (s *floorState) next(owned []int, now time.Time, poll time.Duration) (head bool, after int64) {
	if !s.on {
		return false, 0
	}
	if !slices.Equal(owned, s.owned) {
		s.floor, s.lastHead = 0, time.Time{}
	}
	every := poll
	if s.chain.final == 0 {
		every = min(poll, firstLooks) // nothing final yet: look again soon
	}
	if now.Sub(s.lastHead) < every {
		return false, s.floor
	}
	s.lastHead, s.owned, s.returned = now, slices.Clone(owned), math.MaxInt64
	return true, 0
}

// headRead sets the floor from a head read's looks before and after it and
// its rows (in id order).
func (s *floorState) headRead(before sqladapters.Horizon, rows []sqladapters.OutboxRow, after sqladapters.Horizon) {
	f := s.chain.add(before)
	if len(rows) > 0 {
		f = min(f, rows[0].ID-1)
	}
	lows := []int64{before.RetryMin, after.RetryMin}
	if s.holds {
		lows = append(lows, before.HoldMin, after.HoldMin)
	}
	for _, r := range lows {
		if r > 0 {
			f = min(f, r-1)
		}
	}
	s.floor = max(min(f, s.returned), 0)
	// A look like any other for the claims to come; the floor above
	// stays with what the read could see.
	s.chain.add(after)
}

// handedBack lowers the floor below id, a row that is pending again.
func (s *floorState) handedBack(id int64) {
	s.floor = max(min(s.floor, id-1), 0)
	s.returned = min(s.returned, id-1)
}
