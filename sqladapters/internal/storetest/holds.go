package storetest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/millbox/millbox/sqladapters"
)

// Dead letters that hold their keys (sqladapters.Failure.Hold,
// PendingQuery.DeadLetterHolds).
var holdCases = []testCase{
	{"HeldKeysRead", testHeldKeysRead},
	{"HeldKeyRequeue", testHeldKeyRequeue},
	{"HeldKeyDiscard", testHeldKeyDiscard},
	{"HeldKeysCount", testHeldKeysCount},
}

// holdKeys is the outbox of the hold cases: key a's second row dies
// holding its key; key c shares a's hash, so only the full key tells them
// apart; key b and a row without a key flow.
type holdKeys struct {
	a1, a2, a3, b1, c1, u1, a4 int64
}

func (e *env) holdOutbox() holdKeys {
	e.t.Helper()
	e.migrated()
	id := e.insert(msg("a1", "a", 1), msg("a2", "a", 1), msg("a3", "a", 1), msg("b1", "b", 2), msg("c1", "c", 1), msg("u1", "", 3))
	a4 := e.insert(msg("a4", "a", 1))[0]
	h := holdKeys{id[0], id[1], id[2], id[3], id[4], id[5], a4}
	if n := e.fail(sqladapters.Failure{ID: h.a2, Attempts: 3, Error: "rejected", Dead: true, Hold: true}); n != 1 {
		e.t.Fatalf("RecordFailure of a2 changed %d rows", n)
	}
	return h
}

var heldRead = sqladapters.PendingQuery{DeadLetterHolds: true, Limit: 100}

func (e *env) heldKeys() []sqladapters.HeldKey {
	e.t.Helper()
	ks, err := e.d.HeldKeys(e.ctx, e.db, 100)
	e.check(err, "HeldKeys")
	return ks
}

// testHeldKeysRead: a read with HeldKeys leaves out the rows of a key
// after its dead letter that holds it, and nothing else: not the key's
// earlier rows, not another key with the same hash, not rows without a
// key. A read without it returns them as before, and dead letters that do
// not hold their key hold nothing.
func testHeldKeysRead(e *env) {
	h := e.holdOutbox()
	if got, want := e.pendingIDs(heldRead), []int64{h.a1, h.b1, h.c1, h.u1}; !slices.Equal(got, want) {
		e.t.Fatalf("held read: %v, want %v (a3 and a4 held behind a2)", got, want)
	}
	if got, want := e.pendingIDs(sqladapters.PendingQuery{Limit: 100}), []int64{h.a1, h.a3, h.b1, h.c1, h.u1, h.a4}; !slices.Equal(got, want) {
		e.t.Fatalf("read without holds: %v, want %v", got, want)
	}
	for name, q := range map[string]sqladapters.PendingQuery{
		"owned":    {DeadLetterHolds: true, Partitions: 4, Owned: []int{1}, Limit: 100},
		"after":    {DeadLetterHolds: true, After: h.a1, Limit: 100},
		"excluded": {DeadLetterHolds: true, Exclude: []int64{h.b1}, Limit: 100},
		"limit":    {DeadLetterHolds: true, Limit: 2},
	} {
		want := map[string][]int64{
			"owned":    {h.a1, h.c1},
			"after":    {h.b1, h.c1, h.u1},
			"excluded": {h.a1, h.c1, h.u1},
			"limit":    {h.a1, h.b1},
		}[name]
		if got := e.pendingIDs(q); !slices.Equal(got, want) {
			e.t.Fatalf("held read %s: %v, want %v", name, got, want)
		}
	}

	// A dead letter recorded without Hold, and one without a key, hold
	// nothing.
	e.kill("not held", h.b1)
	if n := e.fail(sqladapters.Failure{ID: h.u1, Attempts: 3, Error: "no key", Dead: true, Hold: true}); n != 1 {
		e.t.Fatalf("RecordFailure of u1 changed %d rows", n)
	}
	b2 := e.insert(msg("b2", "b", 2), msg("u2", "", 3))
	if got, want := e.pendingIDs(heldRead), []int64{h.a1, h.c1, b2[0], b2[1]}; !slices.Equal(got, want) {
		e.t.Fatalf("held read after dead letters that hold nothing: %v, want %v", got, want)
	}
	holds := map[int64]bool{}
	for _, dl := range e.dead(sqladapters.DeadLetterQuery{Limit: 10}) {
		holds[dl.ID] = dl.Holds
	}
	if want := map[int64]bool{h.a2: true, h.b1: false, h.u1: false}; fmt.Sprint(holds) != fmt.Sprint(want) {
		e.t.Fatalf("dead letters holding their keys: %v, want %v", holds, want)
	}
	if e.d.Features().Horizon {
		hz, err := e.d.PendingHorizon(e.ctx, e.db)
		e.check(err, "PendingHorizon")
		if hz.HoldMin != h.a2 {
			e.t.Fatalf("horizon's HoldMin %d, want a2's id %d", hz.HoldMin, h.a2)
		}
	}
	e.noneInUse("held reads")
}

// testHeldKeyRequeue: a requeued dead letter that held its key goes back
// under its own id, so the key's rows are read in order from it.
func testHeldKeyRequeue(e *env) {
	h := e.holdOutbox()
	n, err := e.d.RequeueDeadLetters(e.ctx, e.db, []int64{h.a2})
	e.check(err, "RequeueDeadLetters")
	if n != 1 {
		e.t.Fatalf("requeue changed %d rows", n)
	}
	rows := e.pending(heldRead)
	if got, want := ids(rows), []int64{h.a1, h.a2, h.a3, h.b1, h.c1, h.u1, h.a4}; !slices.Equal(got, want) {
		e.t.Fatalf("held read after requeue: %v, want %v", got, want)
	}
	var a []string
	for _, r := range rows {
		if r.Key == "a" {
			a = append(a, r.UUID)
		}
	}
	if want := []string{"a1", "a2", "a3", "a4"}; !slices.Equal(a, want) {
		e.t.Fatalf("key a reads as %v, want %v", a, want)
	}
	if ks := e.heldKeys(); len(ks) != 0 {
		e.t.Fatalf("held keys after requeue: %+v", ks)
	}
	if e.d.Features().Horizon {
		hz, err := e.d.PendingHorizon(e.ctx, e.db)
		e.check(err, "PendingHorizon")
		if hz.HoldMin != 0 {
			e.t.Fatalf("horizon's HoldMin %d after requeue, want 0", hz.HoldMin)
		}
	}
	e.noneInUse("held requeue")
}

// testHeldKeyDiscard: discarding the dead letter releases its key.
func testHeldKeyDiscard(e *env) {
	h := e.holdOutbox()
	n, err := e.d.DiscardDeadLetters(e.ctx, e.db, []int64{h.a2})
	e.check(err, "DiscardDeadLetters")
	if n != 1 {
		e.t.Fatalf("discard changed %d rows", n)
	}
	if got, want := e.pendingIDs(heldRead), []int64{h.a1, h.a3, h.b1, h.c1, h.u1, h.a4}; !slices.Equal(got, want) {
		e.t.Fatalf("held read after discard: %v, want %v", got, want)
	}
	if st := e.stats(); st.HeldKeys != 0 || st.Dead != 0 {
		e.t.Fatalf("stats after discard: %+v", st)
	}
	e.noneInUse("held discard")
}

// testHeldKeysCount: the stats count the held keys, and HeldKeys lists
// each with its dead letter and the rows waiting behind it (not the key's
// earlier rows, not another key's with the same hash).
func testHeldKeysCount(e *env) {
	h := e.holdOutbox()
	if st := e.stats(); st.HeldKeys != 1 || st.Dead != 1 || st.Pending != 6 {
		e.t.Fatalf("stats with one held key: %+v", st)
	}
	if got, want := e.heldKeys(), []sqladapters.HeldKey{{Key: "a", DeadLetterID: h.a2, Held: 2}}; !slices.Equal(got, want) {
		e.t.Fatalf("held keys %+v, want %+v", got, want)
	}
	// A second key, held with nothing behind it, lists after the first.
	if n := e.fail(sqladapters.Failure{ID: h.c1, Attempts: 3, Error: "rejected", Dead: true, Hold: true}); n != 1 {
		e.t.Fatalf("RecordFailure of c1 changed %d rows", n)
	}
	want := []sqladapters.HeldKey{{Key: "a", DeadLetterID: h.a2, Held: 2}, {Key: "c", DeadLetterID: h.c1, Held: 0}}
	if got := e.heldKeys(); !slices.Equal(got, want) {
		e.t.Fatalf("held keys %+v, want %+v", got, want)
	}
	if st := e.stats(); st.HeldKeys != 2 {
		e.t.Fatalf("stats with two held keys: %+v", st)
	}
	if n, err := e.d.CountHeldKeys(e.ctx, e.db); err != nil || n != 2 {
		e.t.Fatalf("CountHeldKeys: %d, %v; want 2", n, err)
	}
	ks, err := e.d.HeldKeys(e.ctx, e.db, 1)
	e.check(err, "HeldKeys")
	if !slices.Equal(ks, want[:1]) {
		e.t.Fatalf("held keys limited to 1: %+v", ks)
	}
	for _, limit := range []int{0, 50001} {
		if _, err := e.d.HeldKeys(e.ctx, e.db, limit); !errors.Is(err, sqladapters.ErrInvalidConfig) {
			e.t.Fatalf("HeldKeys with limit %d: %v, want ErrInvalidConfig", limit, err)
		}
	}
	e.noneInUse("held keys")
}
