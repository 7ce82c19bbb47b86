package storetest

import (
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Pending reads: what the forwarder reads next, in which order, and what
// it may skip.
var pendingCases = []testCase{
	{"ReadPending", testReadPending},
	{"ReadPendingBackoff", testReadPendingBackoff},
	{"ReadPendingBacklog", testReadPendingBacklog},
	{"ReadPendingInTransaction", testReadPendingInTransaction},
	{"PendingHorizon", testPendingHorizon},
	{"ReadPendingSkipKeys", testReadPendingSkipKeys},
}

// testReadPendingSkipKeys: the keys a forwarder holds back itself are
// left out, whole keys compared (a key sharing another's prefix, a long
// key, a key with quotes), and rows without a key are not.
func testReadPendingSkipKeys(e *env) {
	e.migrated()
	long := strings.Repeat("k", 3000)
	id := e.insert(msg("a", "a", 1), msg("ab", "ab", 1), msg("l", long, 2), msg("q", `"q",{}\`, 3), msg("n", "", 4))
	for name, c := range map[string]struct {
		skip []string
		want []int64
	}{
		"none":   {nil, id},
		"one":    {[]string{"a"}, []int64{id[1], id[2], id[3], id[4]}},
		"long":   {[]string{long}, []int64{id[0], id[1], id[3], id[4]}},
		"quoted": {[]string{`"q",{}\`, "ab"}, []int64{id[0], id[2], id[4]}},
		"all":    {[]string{"a", "ab", long, `"q",{}\`}, []int64{id[4]}},
	} {
		got := e.pendingIDs(sqladapters.PendingQuery{SkipKeys: c.skip, Limit: 100})
		if !slices.Equal(got, c.want) {
			e.t.Errorf("%s: read %v, want %v", name, got, c.want)
		}
	}
}

// testReadPending checks the limit, the excluded ids, the owned partitions
// and the id order of the forwarder's read.
func testReadPending(e *env) {
	e.migrated()
	if got := e.pending(sqladapters.PendingQuery{Limit: 10}); len(got) != 0 {
		e.t.Fatalf("empty outbox read %d rows", len(got))
	}
	id := e.insert(msgs("m", 8)...) // key hashes 0..7
	pick := func(is ...int) []int64 {
		out := []int64{}
		for _, i := range is {
			out = append(out, id[i])
		}
		return out
	}
	for name, c := range map[string]struct {
		q    sqladapters.PendingQuery
		want []int64
	}{
		"all":              {sqladapters.PendingQuery{Limit: 100}, id},
		"limit":            {sqladapters.PendingQuery{Limit: 3}, pick(0, 1, 2)},
		"exclude":          {sqladapters.PendingQuery{Exclude: pick(0, 2), Limit: 3}, pick(1, 3, 4)},
		"exclude all":      {sqladapters.PendingQuery{Exclude: id, Limit: 100}, nil},
		"owned":            {sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, Limit: 100}, pick(1, 3, 5, 7)},
		"owned and limit":  {sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, Limit: 2}, pick(1, 3)},
		"owned, excluded":  {sqladapters.PendingQuery{Partitions: 4, Owned: []int{0}, Exclude: pick(0), Limit: 100}, pick(4)},
		"owned none":       {sqladapters.PendingQuery{Partitions: 4, Owned: []int{}, Limit: 100}, nil},
		"owned nil":        {sqladapters.PendingQuery{Partitions: 4, Limit: 100}, id},
		"one partition":    {sqladapters.PendingQuery{Partitions: 1, Owned: []int{0}, Limit: 100}, id},
		"excluded unknown": {sqladapters.PendingQuery{Exclude: []int64{-1, id[7] + 1000}, Limit: 100}, id},
		"after":            {sqladapters.PendingQuery{After: id[2], Limit: 100}, pick(3, 4, 5, 6, 7)},
		"after the last":   {sqladapters.PendingQuery{After: id[7], Limit: 100}, nil},
		"after, owned":     {sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, After: id[1], Limit: 2}, pick(3, 5)},
		"after, excluded":  {sqladapters.PendingQuery{Exclude: pick(4), After: id[2], Limit: 2}, pick(3, 5)},
	} {
		got := e.pendingIDs(c.q)
		if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			e.t.Errorf("%s: read %v, want %v", name, got, c.want)
		}
	}
	e.noneInUse("ReadPending")
}

// testPendingHorizon checks what a forwarder's floor relies on: the mark
// covers the rows inserted, every look takes a newer transaction id, a
// transaction that inserted a row and is still open keeps XMin below the
// id of every look taken after its row's id was drawn (and lets it pass
// once it ended), and RetryMin is the lowest row waiting for a retry.
func testPendingHorizon(e *env) {
	d := e.migrated()
	if !d.Features().Horizon {
		if _, err := d.PendingHorizon(e.ctx, e.db); !errors.Is(err, errors.ErrUnsupported) {
			e.t.Fatalf("PendingHorizon without Features().Horizon: %v, want errors.ErrUnsupported", err)
		}
		return
	}
	look := func() sqladapters.Horizon {
		e.t.Helper()
		h, err := d.PendingHorizon(e.ctx, e.db)
		e.check(err, "PendingHorizon")
		if h.XMin > h.XID {
			e.t.Fatalf("look %+v: XMin above the look's own XID", h)
		}
		return h
	}
	h0 := look()
	if h0.Mark != 0 || h0.RetryMin != 0 {
		e.t.Fatalf("empty outbox: %+v, want mark and retry 0", h0)
	}
	id := e.insert(msgs("h", 3)...)
	h1 := look()
	if h1.Mark < id[2] || h1.XID <= h0.XID {
		e.t.Fatalf("after inserting ids %v: %+v (before: %+v)", id, h1, h0)
	}

	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	defer sqladapters.Rollback(tx)
	e.check(d.InsertOutbox(e.ctx, tx, []sqladapters.OutboxMessage{msg("open", "k", 0)}), "InsertOutbox")
	h2 := look() // its XID is newer than the open transaction's
	if h2.Mark <= h1.Mark {
		e.t.Fatalf("the open transaction drew an id, yet the mark stayed at %d", h2.Mark)
	}
	for range 3 {
		if h := look(); h.XMin >= h2.XID {
			e.t.Fatalf("a transaction that inserted a row is open, yet XMin %d reached the XID %d of a look after its row", h.XMin, h2.XID)
		}
	}
	e.check(tx.Commit(e.ctx), "commit")
	// Other work on the server may hold XMin back a moment longer.
	deadline := time.Now().Add(30 * time.Second)
	for h := look(); h.XMin < h2.XID; h = look() {
		if time.Now().After(deadline) {
			e.t.Fatalf("30 s after the commit XMin %d is still below %d", h.XMin, h2.XID)
		}
		time.Sleep(10 * time.Millisecond)
	}

	e.fail(sqladapters.Failure{ID: id[1], Attempts: 1, Error: "x", Backoff: time.Hour})
	if got := look().RetryMin; got != id[1] {
		e.t.Fatalf("one row waits for a retry: RetryMin %d, want %d", got, id[1])
	}
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "x", Backoff: time.Hour})
	if got := look().RetryMin; got != id[0] {
		e.t.Fatalf("two rows wait for a retry: RetryMin %d, want %d", got, id[0])
	}
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 2, Error: "x", Dead: true})
	if got := look().RetryMin; got != id[1] {
		e.t.Fatalf("the lower one is dead: RetryMin %d, want %d", got, id[1])
	}
	e.noneInUse("PendingHorizon")
}

// testReadPendingBackoff checks that a key's row waiting for a retry holds
// back the key's later rows, and only those.
func testReadPendingBackoff(e *env) {
	e.migrated()
	// Every message shares one key hash: the check compares the keys.
	id := e.insert(msg("k0", "k", 5), msg("k1", "k", 5), msg("j0", "j", 5), msg("n0", "", 5), msg("k2", "k", 5))
	if n := e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "broker down", Backoff: time.Hour}); n != 1 {
		e.t.Fatalf("RecordFailure changed %d rows", n)
	}
	q := sqladapters.PendingQuery{Limit: 100}
	if got, want := e.pendingIDs(q), []int64{id[2], id[3]}; !slices.Equal(got, want) {
		e.t.Fatalf("with k0 backing off read %v, want %v (k's rows held back, others not)", got, want)
	}
	q4 := sqladapters.PendingQuery{Partitions: 4, Owned: []int{1}, Limit: 100}
	if got, want := e.pendingIDs(q4), []int64{id[2], id[3]}; !slices.Equal(got, want) {
		e.t.Fatalf("partition read with k0 backing off: %v, want %v", got, want)
	}
	// A row without a key that backs off holds no other keyless row back.
	n := e.insert(msg("n1", "", 5))
	e.fail(sqladapters.Failure{ID: id[3], Attempts: 1, Error: "broker down", Backoff: time.Hour})
	if got, want := e.pendingIDs(q), []int64{id[2], n[0]}; !slices.Equal(got, want) {
		e.t.Fatalf("with k0 and n0 backing off read %v, want %v", got, want)
	}
	e.fail(sqladapters.Failure{ID: id[3], Attempts: 1, Error: "broker down"})
	if _, err := e.d.CompleteForwarded(e.ctx, e.db, n, false); err != nil {
		e.t.Fatalf("CompleteForwarded: %v", err)
	}
	// A dead row holds nothing back.
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 2, Error: "gave up", Dead: true})
	if got, want := e.pendingIDs(q), id[1:]; !slices.Equal(got, want) {
		e.t.Fatalf("with k0 dead read %v, want %v", got, want)
	}
	// A row whose retry is due is read, with its attempts, and holds
	// nothing back.
	e.fail(sqladapters.Failure{ID: id[1], Attempts: 1, Error: "once"})
	rows := e.pending(q)
	if got, want := ids(rows), id[1:]; !slices.Equal(got, want) {
		e.t.Fatalf("with k1's retry due read %v, want %v", got, want)
	}
	if rows[0].Attempts != 1 || rows[1].Attempts != 0 {
		e.t.Fatalf("attempts read back %d and %d, want 1 and 0", rows[0].Attempts, rows[1].Attempts)
	}
	e.noneInUse("ReadPending")
}

// testReadPendingBacklog checks that the read of a backlog returns what
// the plain read does, and that ages are never negative.
func testReadPendingBacklog(e *env) {
	e.migrated()
	id := e.insert(msgs("b", 20)...)
	for _, q := range []sqladapters.PendingQuery{
		{Limit: 100},
		{Limit: 5, Exclude: id[:3]},
		{Partitions: 4, Owned: []int{2}, Limit: 100},
	} {
		plain := e.pending(q)
		backlog, err := e.d.ReadPending(e.ctx, e.db, q, true)
		e.check(err, "ReadPending of a backlog")
		if !slices.Equal(ids(plain), ids(backlog)) {
			e.t.Fatalf("%+v: the backlog read %v, the plain one %v", q, ids(backlog), ids(plain))
		}
		for _, r := range append(plain, backlog...) {
			if r.Age < 0 {
				e.t.Fatalf("row %d is %v old", r.ID, r.Age)
			}
		}
	}
	e.noneInUse("ReadPending of a backlog")
}

// testReadPendingInTransaction reads in a read-only transaction, as the
// plain and the backlog read: the transaction sees the rows committed
// before it began, and no row is younger than zero. A row committed after
// the transaction began may be left for a later read (Postgres keeps the
// transaction's start as its clock), but it is never read with a negative
// age.
func testReadPendingInTransaction(e *env) {
	e.migrated()
	for _, backlog := range []bool{false, true} {
		id := e.insert(msg(fmt.Sprint("backlog=", backlog), "", 0))
		tx, err := e.db.Begin(e.ctx, sql.TxOptions{ReadOnly: true})
		e.check(err, "begin")
		later := e.insert(msg(fmt.Sprint("later, backlog=", backlog), "", 0))
		rows, err := e.d.ReadPending(e.ctx, tx, sqladapters.PendingQuery{Limit: 10}, backlog)
		sqladapters.Rollback(tx)
		e.check(err, "ReadPending")
		if got := ids(rows); !slices.Equal(got, id) && !slices.Equal(got, append(id, later...)) {
			e.t.Fatalf("backlog=%v: read %v in the transaction, want %v and maybe %v", backlog, got, id, later)
		}
		for _, r := range rows {
			if r.Age < 0 {
				e.t.Errorf("backlog=%v: row %d is %v old", backlog, r.ID, r.Age)
			}
		}
		_, err = e.d.CompleteForwarded(e.ctx, e.db, append(id, later...), false)
		e.check(err, "CompleteForwarded")
	}
	e.noneInUse("ReadPending")
}
