package forwarder

import (
	"math"
	"slices"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// A forwarder deletes the rows it published, but the database keeps their
// entries in the pending index until vacuum removes them, and a read in id
// order walks every one of them before it reaches the first pending row:
// after a few million rows drained between two vacuums, that is tens of
// milliseconds per read. Where the dialect reports a Horizon, the
// forwarder reads past them instead (PendingQuery.After), starting after
// its floor: an id up to which no row is pending or can become pending
// without this forwarder knowing.
//
// The floor is set by a head read, one that starts at the first row and
// is preceded by a look at the horizon; one runs at least every
// PollInterval, so a row below the floor that becomes pending after all
// (a dead letter requeued by an operator) waits no longer than a poll.
// The floor is the lowest of:
//
//   - the final mark: ids up to it belong to transactions that have all
//     ended (see horizonChain), so no row up to it can still appear;
//   - one below the head read's first row: the read returns the lowest
//     pending ids first, so none is left below it but rows in flight here;
//   - one below the lowest row waiting for a retry: such a row, and the
//     later rows of its key it holds back, become due without a new insert;
//   - one below every row this forwarder handed back to the outbox since
//     the head read started (a failed attempt, a lane given up): they are
//     pending again.
//
// Rows handed back later lower the floor at once; a change of the owned
// partitions sets it to zero until the next head read.

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

// add records one look and returns the final mark.
func (c *horizonChain) add(h sqladapters.Horizon) int64 {
	if c.looked && len(c.pending) < maxClaims {
		c.pending = append(c.pending, claim{mark: c.prev, xid: h.XID})
	}
	c.looked, c.prev = true, h.Mark
	c.pending = slices.DeleteFunc(c.pending, func(cl claim) bool {
		if h.XMin >= cl.xid {
			c.final = max(c.final, cl.mark)
			return true
		}
		return false
	})
	return c.final
}

// floorState is the dispatcher's part of the above.
type floorState struct {
	on       bool // the dialect reports a horizon
	floor    int64
	chain    horizonChain
	lastHead time.Time
	owned    []int // the partitions of the last head read (nil: all)
	returned int64 // lowest id handed back since the head read in flight started, less one
}

// next tells whether the read about to start is a head read and where it
// starts. owned is what the read covers.
func (s *floorState) next(owned []int, now time.Time, poll time.Duration) (head bool, after int64) {
	if !s.on {
		return false, 0
	}
	if !slices.Equal(owned, s.owned) {
		s.floor = 0
	}
	if now.Sub(s.lastHead) < poll && s.floor > 0 {
		return false, s.floor
	}
	s.lastHead, s.owned, s.returned = now, slices.Clone(owned), math.MaxInt64
	return true, 0
}

// headRead sets the floor from a head read's look and rows (in id order).
func (s *floorState) headRead(h sqladapters.Horizon, rows []sqladapters.OutboxRow) {
	f := s.chain.add(h)
	if len(rows) > 0 {
		f = min(f, rows[0].ID-1)
	}
	if h.RetryMin > 0 {
		f = min(f, h.RetryMin-1)
	}
	s.floor = max(min(f, s.returned), 0)
}

// handedBack lowers the floor below id, a row that is pending again.
func (s *floorState) handedBack(id int64) {
	s.floor = max(min(s.floor, id-1), 0)
	s.returned = min(s.returned, id-1)
}
