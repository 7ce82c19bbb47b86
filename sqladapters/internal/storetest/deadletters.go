package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/millbox/millbox/sqladapters"
)

// Dead letters and the operations verbs: listing, filters, groups,
// requeue and discard, status and prune.
var deadLetterCases = []testCase{
	{"DeadLetters", testDeadLetters},
	{"DeadLetterFilters", testDeadLetterFilters},
	{"GroupDeadLetters", testGroupDeadLetters},
	{"ErrorFingerprints", testErrorFingerprints},
	{"LongErrors", testLongErrors},
	{"RequeuedRowsWaitFromTheRequeue", testRequeueAge},
	{"DiscardDeadLetters", testDiscardDeadLetters},
	{"TopicStats", testTopicStats},
	{"ForwardedBefore", testForwardedBefore},
}

// dead returns the page q of dead letters.
func (e *env) dead(q sqladapters.DeadLetterQuery) []sqladapters.DeadLetter {
	e.t.Helper()
	dls, err := e.d.ListDeadLetters(e.ctx, e.db, q)
	e.check(err, "ListDeadLetters")
	return dls
}

func deadIDs(dls []sqladapters.DeadLetter) []int64 {
	out := []int64{}
	for _, dl := range dls {
		out = append(out, dl.ID)
	}
	return out
}

// kill makes the rows dead with errText.
func (e *env) kill(errText string, ids ...int64) {
	e.t.Helper()
	for _, id := range ids {
		if n := e.fail(sqladapters.Failure{ID: id, Attempts: 3, Error: errText, Dead: true}); n != 1 {
			e.t.Fatalf("RecordFailure of %d changed %d rows", id, n)
		}
	}
}

// testDeadLetters pages through dead letters, with and without their
// payloads, and requeues some: only dead rows change, and an empty list
// changes none.
func testDeadLetters(e *env) {
	e.migrated()
	id := e.insert(msg("d0", "key", 1), msg("d1", "", 2), msg("d2", "", 3), msg("d3", "", 4), msg("d4", "", 5))
	dead := []int64{id[0], id[1], id[2], id[4]}
	for i, d := range dead {
		e.kill(fmt.Sprint("boom ", i), d)
	}
	all := e.dead(sqladapters.DeadLetterQuery{Limit: 100, Payloads: true})
	for i, dl := range all {
		m := msg(fmt.Sprint("d", slices.Index(id, dl.ID)), "", 0)
		if dl.UUID != m.UUID || dl.Topic != m.Topic || !bytes.Equal(dl.Payload, m.Payload) || !bytes.Contains(dl.Metadata, []byte(m.UUID)) ||
			dl.Attempts != 3 || dl.LastError != fmt.Sprint("boom ", i) {
			e.t.Fatalf("dead letter %d: %+v", i, dl)
		}
		if dl.CreatedAt.IsZero() || dl.DeadAt.IsZero() || dl.DeadAt.Before(dl.CreatedAt) {
			e.t.Fatalf("dead letter %d created %v, dead %v", i, dl.CreatedAt, dl.DeadAt)
		}
	}
	if got := deadIDs(all); !slices.Equal(got, dead) {
		e.t.Fatalf("dead letters %v, want %v", got, dead)
	}
	if all[0].Key != "key" || all[1].Key != "" {
		e.t.Fatalf("keys %q %q", all[0].Key, all[1].Key)
	}
	// A listing leaves payloads and metadata out, and nothing else.
	for i, dl := range e.dead(sqladapters.DeadLetterQuery{Limit: 100}) {
		if dl.Payload != nil || dl.Metadata != nil {
			e.t.Fatalf("dead letter %d listed without payloads has payload %q and metadata %q", dl.ID, dl.Payload, dl.Metadata)
		}
		want := all[i]
		want.Payload, want.Metadata = nil, nil
		if fmt.Sprint(dl) != fmt.Sprint(want) {
			e.t.Fatalf("listed without payloads as %+v, want %+v", dl, want)
		}
	}
	page := func(after int64) []int64 {
		return deadIDs(e.dead(sqladapters.DeadLetterQuery{AfterID: after, Limit: 2}))
	}
	if p1, p2, p3 := page(0), page(dead[1]), page(dead[3]); !slices.Equal(p1, dead[:2]) || !slices.Equal(p2, dead[2:]) || len(p3) != 0 {
		e.t.Fatalf("pages %v %v %v", p1, p2, p3)
	}
	for _, limit := range []int{0, -1, 50001} {
		if _, err := e.d.ListDeadLetters(e.ctx, e.db, sqladapters.DeadLetterQuery{Limit: limit}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
			e.t.Fatalf("ListDeadLetters with limit %d: %v, want ErrInvalidConfig", limit, err)
		}
	}

	requeue := func(ids []int64) int64 {
		e.t.Helper()
		n, err := e.d.RequeueDeadLetters(e.ctx, e.db, ids)
		e.check(err, "RequeueDeadLetters")
		return n
	}
	if n := requeue(nil); n != 0 || e.stats().Dead != 4 {
		e.t.Fatalf("requeueing no ids changed %d rows", n)
	}
	if n := requeue([]int64{dead[0], id[3]}); n != 1 {
		e.t.Fatalf("requeueing one dead and one pending row changed %d", n)
	}
	rows := e.pending(sqladapters.PendingQuery{Limit: 100})
	if got, want := ids(rows), []int64{id[0], id[3]}; !slices.Equal(got, want) || rows[0].Attempts != 0 {
		e.t.Fatalf("pending after requeue: %+v, want %v with no attempts", rows, want)
	}
	if n := requeue(dead); n != 3 {
		e.t.Fatalf("requeueing the rest changed %d rows, want 3", n)
	}
	if st := e.stats(); st.Dead != 0 || st.Pending != 5 {
		e.t.Fatalf("stats after requeueing all: %+v", st)
	}
	if got := e.dead(sqladapters.DeadLetterQuery{Limit: 10}); len(got) != 0 {
		e.t.Fatalf("dead letters after requeueing all: %v", deadIDs(got))
	}
	e.noneInUse("dead letters")
}

// testDeadLetterFilters selects dead letters by every field of a filter,
// alone and together, in the listing, the id pages and the count alike.
// Filter values are data, never SQL or patterns.
func testDeadLetterFilters(e *env) {
	e.migrated()
	ms := []sqladapters.OutboxMessage{
		{Topic: "orders", UUID: "o1", Payload: []byte("x"), Metadata: []byte(`{}`), Key: "k1", KeyHash: 1},
		{Topic: "orders", UUID: "o2", Payload: []byte("x"), Metadata: []byte(`{}`), Key: "k2", KeyHash: 2},
		{Topic: "payments", UUID: "p1", Payload: []byte("x"), Metadata: []byte(`{}`), Key: "k1", KeyHash: 1},
		{Topic: "payments", UUID: "p2", Payload: []byte("x"), Metadata: []byte(`{}`)},
		{Topic: "orders", UUID: "pending", Payload: []byte("x"), Metadata: []byte(`{}`), Key: "k1", KeyHash: 1},
		{Topic: "ord%", UUID: "pct", Payload: []byte("x"), Metadata: []byte(`{}`), Key: "k_", KeyHash: 3},
	}
	id := e.insert(ms...)
	e.kill("kafka: connection refused", id[0], id[2])
	e.kill("schema: 100% wrong_field 'x'; DROP TABLE t; --", id[1])
	e.kill("ключ: Connection Refused", id[3])
	e.kill("boom", id[5])
	time.Sleep(50 * time.Millisecond) // so that they died more than 10 ms ago

	for name, c := range map[string]struct {
		f    sqladapters.DeadLetterFilter
		want []int64
	}{
		"none":                  {sqladapters.DeadLetterFilter{}, []int64{id[0], id[1], id[2], id[3], id[5]}},
		"ids":                   {sqladapters.DeadLetterFilter{IDs: []int64{id[1], id[4], id[5]}}, []int64{id[1], id[5]}},
		"topic":                 {sqladapters.DeadLetterFilter{Topic: "orders"}, []int64{id[0], id[1]}},
		"topic is no pattern":   {sqladapters.DeadLetterFilter{Topic: "ord%"}, []int64{id[5]}},
		"key":                   {sqladapters.DeadLetterFilter{Key: "k1"}, []int64{id[0], id[2]}},
		"key is no pattern":     {sqladapters.DeadLetterFilter{Key: "k_"}, []int64{id[5]}},
		"error":                 {sqladapters.DeadLetterFilter{ErrorContains: "connection refused"}, []int64{id[0], id[2]}},
		"error is exact case":   {sqladapters.DeadLetterFilter{ErrorContains: "Connection Refused"}, []int64{id[3]}},
		"error is no pattern":   {sqladapters.DeadLetterFilter{ErrorContains: "100% wrong_"}, []int64{id[1]}},
		"error with quotes":     {sqladapters.DeadLetterFilter{ErrorContains: "'x'; DROP TABLE t; --"}, []int64{id[1]}},
		"a percent sign":        {sqladapters.DeadLetterFilter{ErrorContains: "%"}, []int64{id[1]}},
		"together":              {sqladapters.DeadLetterFilter{Topic: "payments", Key: "k1", ErrorContains: "refused"}, []int64{id[2]}},
		"nothing together":      {sqladapters.DeadLetterFilter{Topic: "orders", ErrorContains: "ключ"}, nil},
		"newer than an hour":    {sqladapters.DeadLetterFilter{NewerThan: time.Hour}, []int64{id[0], id[1], id[2], id[3], id[5]}},
		"older than an hour":    {sqladapters.DeadLetterFilter{OlderThan: time.Hour}, nil},
		"older than 10ms":       {sqladapters.DeadLetterFilter{OlderThan: 10 * time.Millisecond, Topic: "payments"}, []int64{id[2], id[3]}},
		"newer than 10ms":       {sqladapters.DeadLetterFilter{NewerThan: 10 * time.Millisecond}, nil},
		"older and newer":       {sqladapters.DeadLetterFilter{OlderThan: 10 * time.Millisecond, NewerThan: time.Hour, Key: "k2"}, []int64{id[1]}},
		"ids and other filters": {sqladapters.DeadLetterFilter{IDs: id, Topic: "payments"}, []int64{id[2], id[3]}},
	} {
		got := deadIDs(e.dead(sqladapters.DeadLetterQuery{Filter: c.f, Limit: 100}))
		if !slices.Equal(got, c.want) && len(got)+len(c.want) > 0 {
			e.t.Errorf("%s: listed %v, want %v", name, got, c.want)
		}
		n, err := e.d.CountDeadLetters(e.ctx, e.db, c.f)
		e.check(err, "CountDeadLetters")
		if n != int64(len(c.want)) {
			e.t.Errorf("%s: counted %d, want %d", name, n, len(c.want))
		}
		var paged []int64
		for after := int64(0); ; {
			page, err := e.d.DeadLetterIDs(e.ctx, e.db, c.f, after, 1)
			e.check(err, "DeadLetterIDs")
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			after = page[len(page)-1]
		}
		if !slices.Equal(paged, c.want) && len(paged)+len(c.want) > 0 {
			e.t.Errorf("%s: ids paged one by one %v, want %v", name, paged, c.want)
		}
	}
	if f := (sqladapters.DeadLetterFilter{}); !f.IsZero() {
		e.t.Error("the zero filter is not zero")
	}
	if f := (sqladapters.DeadLetterFilter{NewerThan: time.Hour}); f.IsZero() {
		e.t.Error("a filter with an age is zero")
	}
	e.noneInUse("dead-letter filters")
}

// testGroupDeadLetters groups dead letters by their exact last error,
// largest group first, with its lowest id and the ages of its first and
// latest deaths.
func testGroupDeadLetters(e *env) {
	e.migrated()
	id := e.insert(msgs("g", 7)...)
	e.kill("timeout", id[1], id[4], id[5])
	e.kill("read timeout", id[0], id[6])
	e.kill("", id[3])
	group := func(f sqladapters.DeadLetterFilter, limit int) []sqladapters.ErrorGroup {
		e.t.Helper()
		gs, err := e.d.GroupDeadLetters(e.ctx, e.db, f, limit)
		e.check(err, "GroupDeadLetters")
		return gs
	}
	gs := group(sqladapters.DeadLetterFilter{}, 10)
	type g struct {
		err    string
		fp     sqladapters.ErrorFingerprint
		count  int64
		sample int64
	}
	var got []g
	for _, x := range gs {
		got = append(got, g{x.Error, x.Fingerprint, x.Count, x.SampleID})
		if x.FirstDeadAge < x.LastDeadAge || x.LastDeadAge < 0 {
			e.t.Fatalf("group %q: first death %v ago, latest %v ago", x.Error, x.FirstDeadAge, x.LastDeadAge)
		}
	}
	fp := sqladapters.FingerprintError
	want := []g{{"timeout", fp("timeout"), 3, id[1]}, {"read timeout", fp("read timeout"), 2, id[0]}, {"", fp(""), 1, id[3]}}
	if !slices.Equal(got, want) {
		e.t.Fatalf("groups %+v, want %+v", got, want)
	}
	if got := group(sqladapters.DeadLetterFilter{}, 1); len(got) != 1 || got[0].Error != "timeout" {
		e.t.Fatalf("the largest group: %+v", got)
	}
	if got := group(sqladapters.DeadLetterFilter{ErrorContains: "read"}, 10); len(got) != 1 || got[0].Count != 2 {
		e.t.Fatalf("groups of errors containing read: %+v", got)
	}
	if _, err := e.d.GroupDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}, 0); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		e.t.Fatalf("GroupDeadLetters with limit 0: %v, want ErrInvalidConfig", err)
	}
	e.noneInUse("GroupDeadLetters")
}

// testDiscardDeadLetters deletes dead rows by id, never a pending row or
// one requeued in the meantime.
func testDiscardDeadLetters(e *env) {
	e.migrated()
	id := e.insert(msgs("x", 4)...)
	e.kill("gone", id[0], id[1], id[2])
	discard := func(ids []int64) int64 {
		e.t.Helper()
		n, err := e.d.DiscardDeadLetters(e.ctx, e.db, ids)
		e.check(err, "DiscardDeadLetters")
		return n
	}
	if n := discard(nil); n != 0 {
		e.t.Fatalf("discarding no ids deleted %d rows", n)
	}
	_, err := e.d.RequeueDeadLetters(e.ctx, e.db, id[2:3])
	e.check(err, "RequeueDeadLetters")
	if n := discard(id); n != 2 {
		e.t.Fatalf("discarding 2 dead, 1 requeued and 1 pending row deleted %d", n)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, id[2:]) {
		e.t.Fatalf("pending after discard: %v, want %v", got, id[2:])
	}
	if n, dead := e.count(e.d.OutboxTable()), e.count(e.table("_dead")); n != 2 || dead != 0 {
		e.t.Fatalf("%d rows left in the outbox and %d dead letters, want 2 and none", n, dead)
	}
	e.noneInUse("DiscardDeadLetters")
}

// testTopicStats counts each topic's pending, retrying, dead and kept rows
// and measures its oldest pending row.
func testTopicStats(e *env) {
	e.migrated()
	topics := func() []sqladapters.TopicStats {
		e.t.Helper()
		ts, err := e.d.TopicStats(e.ctx, e.db)
		e.check(err, "TopicStats")
		return ts
	}
	if ts := topics(); len(ts) != 0 {
		e.t.Fatalf("empty outbox: %+v", ts)
	}
	a := msgs("a", 5)
	for i := range a {
		a[i].Topic = "a"
	}
	b := msg("b0", "", 0)
	b.Topic = "b"
	id := e.insert(append(a, b)...)
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "x", Backoff: time.Hour})
	e.kill("y", id[1])
	_, err := e.d.CompleteForwarded(e.ctx, e.db, id[2:4], true)
	e.check(err, "CompleteForwarded")
	_, err = e.d.CompleteForwarded(e.ctx, e.db, id[5:], false)
	e.check(err, "CompleteForwarded")
	ts := topics()
	if len(ts) != 1 {
		e.t.Fatalf("topics %+v, want only a (b's one row was deleted)", ts)
	}
	got := ts[0]
	if got.Topic != "a" || got.Pending != 2 || got.Retrying != 1 || got.Dead != 1 || got.ForwardedKept != 2 {
		e.t.Fatalf("topic a: %+v, want 2 pending (1 retrying), 1 dead, 2 kept", got)
	}
	if got.OldestPendingAge < 0 || got.OldestPendingAge > time.Hour {
		e.t.Fatalf("topic a: oldest pending %v", got.OldestPendingAge)
	}
	e.noneInUse("TopicStats")
}

// testForwardedBefore finds the forwarded rows kept for audit that were
// published before a time, never a pending or dead one, and deletes them.
func testForwardedBefore(e *env) {
	e.migrated()
	id := e.insert(msgs("f", 6)...)
	_, err := e.d.CompleteForwarded(e.ctx, e.db, id[:3], true)
	e.check(err, "CompleteForwarded")
	e.kill("dead", id[3])
	e.fail(sqladapters.Failure{ID: id[4], Attempts: 1, Error: "retry"})
	later, earlier := time.Now().Add(time.Hour), time.Now().Add(-time.Hour)
	count := func(t time.Time) int64 {
		e.t.Helper()
		n, err := e.d.CountForwardedBefore(e.ctx, e.db, t)
		e.check(err, "CountForwardedBefore")
		return n
	}
	if n := count(later); n != 3 {
		e.t.Fatalf("%d forwarded rows before an hour from now, want 3", n)
	}
	if n := count(earlier); n != 0 {
		e.t.Fatalf("%d forwarded rows before an hour ago, want 0", n)
	}
	var paged []int64
	for after := int64(0); ; {
		page, err := e.d.ForwardedIDsBefore(e.ctx, e.db, later, after, 2)
		e.check(err, "ForwardedIDsBefore")
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1]
	}
	if !slices.Equal(paged, id[:3]) {
		e.t.Fatalf("forwarded ids %v, want %v", paged, id[:3])
	}
	if page, err := e.d.ForwardedIDsBefore(e.ctx, e.db, earlier, 0, 10); err != nil || len(page) != 0 {
		e.t.Fatalf("forwarded ids before an hour ago: %v, %v", page, err)
	}
	del := func(ids []int64) int64 {
		e.t.Helper()
		n, err := e.d.DeleteForwarded(e.ctx, e.db, ids)
		e.check(err, "DeleteForwarded")
		return n
	}
	if n := del(nil); n != 0 {
		e.t.Fatalf("deleting no ids deleted %d rows", n)
	}
	// The ids of a pending and a dead row are not kept rows.
	if n := del(append(slices.Clone(paged[:2]), id[3], id[4])); n != 2 {
		e.t.Fatalf("deleting 2 kept, 1 dead and 1 pending row deleted %d", n)
	}
	if n := count(later); n != 1 {
		e.t.Fatalf("%d forwarded rows after deleting 2 of 3, want 1", n)
	}
	if st := e.stats(); st.Pending != 2 || st.Dead != 1 {
		e.t.Fatalf("stats after deleting kept rows: %+v, want 2 pending and 1 dead", st)
	}
	e.noneInUse("ForwardedBefore")
}

// testErrorFingerprints selects one error group by its fingerprint: the
// exact error, never one that merely contains it, in listings, counts and
// id pages. Rows recorded without a fingerprint (by a process built before
// fingerprints) form the group of the zero fingerprint.
func testErrorFingerprints(e *env) {
	e.migrated()
	id := e.insert(msgs("f", 6)...)
	e.kill("timeout", id[0], id[2])
	e.kill("read timeout", id[1])
	e.kill("timeout\x00\xff", id[3]) // stored as valid UTF-8 without NUL
	e.kill("old error", id[4], id[5])
	// As an older forwarder records a failure: no fingerprint.
	e.exec(`UPDATE ` + e.table("_dead") + ` SET error_fp = NULL WHERE id IN (` + fmt.Sprint(id[4]) + `, ` + fmt.Sprint(id[5]) + `)`)

	for _, dl := range e.dead(sqladapters.DeadLetterQuery{Limit: 10}) {
		want := sqladapters.FingerprintError(dl.LastError)
		if dl.ID == id[4] || dl.ID == id[5] {
			want = sqladapters.ErrorFingerprint{}
		}
		if dl.Fingerprint != want {
			e.t.Fatalf("dead letter %d with error %q has fingerprint %v, want %v", dl.ID, dl.LastError, dl.Fingerprint, want)
		}
	}
	timeout, none := sqladapters.FingerprintError("timeout"), sqladapters.ErrorFingerprint{}
	stored := e.dead(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{IDs: id[3:4]}, Limit: 1})[0]
	for name, c := range map[string]struct {
		fp   sqladapters.ErrorFingerprint
		want []int64
	}{
		"exact error":             {timeout, []int64{id[0], id[2]}},
		"error as stored":         {stored.Fingerprint, []int64{id[3]}},
		"recorded without one":    {none, id[4:]},
		"of no error":             {sqladapters.FingerprintError("no such error"), nil},
		"of the text before save": {sqladapters.FingerprintError("timeout\x00\xff"), nil},
	} {
		f := sqladapters.DeadLetterFilter{Fingerprint: &c.fp}
		if got := deadIDs(e.dead(sqladapters.DeadLetterQuery{Filter: f, Limit: 10})); !slices.Equal(got, c.want) && len(got)+len(c.want) > 0 {
			e.t.Errorf("%s: listed %v, want %v", name, got, c.want)
		}
		if n, err := e.d.CountDeadLetters(e.ctx, e.db, f); err != nil || n != int64(len(c.want)) {
			e.t.Errorf("%s: counted %d, %v; want %d", name, n, err, len(c.want))
		}
		if got, err := e.d.DeadLetterIDs(e.ctx, e.db, f, 0, 10); err != nil || !slices.Equal(got, c.want) && len(got)+len(c.want) > 0 {
			e.t.Errorf("%s: ids %v, %v; want %v", name, got, err, c.want)
		}
	}
	gs, err := e.d.GroupDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}, 10)
	e.check(err, "GroupDeadLetters")
	var zero *sqladapters.ErrorGroup
	for i, g := range gs {
		if g.Fingerprint.IsZero() {
			zero = &gs[i]
		} else if g.Fingerprint != sqladapters.FingerprintError(g.Error) {
			e.t.Errorf("group %q has fingerprint %v", g.Error, g.Fingerprint)
		}
	}
	if len(gs) != 4 || zero == nil || zero.Count != 2 || zero.SampleID != id[4] || zero.Error != "old error" {
		e.t.Fatalf("groups %+v, want 4 with one of the 2 rows without a fingerprint", gs)
	}
	n, err := e.d.RequeueDeadLetters(e.ctx, e.db, func() []int64 {
		ids, err := e.d.DeadLetterIDs(e.ctx, e.db, sqladapters.DeadLetterFilter{Fingerprint: &timeout}, 0, 10)
		e.check(err, "DeadLetterIDs")
		return ids
	}())
	if err != nil || n != 2 {
		e.t.Fatalf("requeueing the group of timeout: %d, %v", n, err)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, []int64{id[0], id[2]}) {
		e.t.Fatalf("pending after requeueing the group: %v", got)
	}
	e.noneInUse("error fingerprints")
}

// testRequeueAge checks that a requeued dead letter waits from its
// requeue, not from its creation, in the ages of the stats; and that an
// old row behind it still shows as the oldest. (The forwarder's read
// measures a row's latency from its creation, and runs on a schema of the
// previous version too.)
func testRequeueAge(e *env) {
	e.migrated()
	id := e.insert(msg("r0", "", 0), msg("r1", "", 1))
	e.backdate(id[0], time.Hour)
	e.kill("gone", id[0])
	_, err := e.d.RequeueDeadLetters(e.ctx, e.db, id[:1])
	e.check(err, "RequeueDeadLetters")
	young := func(what string, age time.Duration) {
		e.t.Helper()
		if age < 0 || age > 10*time.Minute {
			e.t.Fatalf("%s: a row requeued a moment ago, created an hour ago, has waited %v", what, age)
		}
	}
	young("OutboxStats", e.stats().OldestPendingAge)
	ts, err := e.d.TopicStats(e.ctx, e.db)
	e.check(err, "TopicStats")
	for _, t := range ts {
		young("TopicStats of "+t.Topic, t.OldestPendingAge)
	}
	// The later row was created an hour ago and never requeued.
	e.backdate(id[1], time.Hour)
	if age := e.stats().OldestPendingAge; age < 50*time.Minute {
		e.t.Fatalf("OutboxStats: a row created an hour ago waits behind a requeued one, yet the oldest has waited %v", age)
	}
	e.noneInUse("requeue ages")
}

// testLongErrors reads the start of long errors only where asked: a
// listing with ErrorChars, and a group's text, cut at characters, never
// inside one.
func testLongErrors(e *env) {
	e.migrated()
	long := strings.Repeat("é", 5000) // 10,000 bytes
	id := e.insert(msgs("l", 2)...)
	e.kill(long, id...)
	dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10, ErrorChars: 7})
	if len(dls) != 2 || dls[0].LastError != strings.Repeat("é", 7) {
		e.t.Fatalf("listed with 7 characters of the error: %+v", dls)
	}
	if full := e.dead(sqladapters.DeadLetterQuery{Limit: 1}); full[0].LastError != long || full[0].Fingerprint != sqladapters.FingerprintError(long) {
		e.t.Fatalf("listed with the whole error: %d bytes", len(full[0].LastError))
	}
	gs, err := e.d.GroupDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}, 10)
	e.check(err, "GroupDeadLetters")
	if len(gs) != 1 || gs[0].Error != strings.Repeat("é", sqladapters.GroupErrorChars) || gs[0].Fingerprint != sqladapters.FingerprintError(long) {
		e.t.Fatalf("the group's error has %d characters, want %d", utf8.RuneCountInString(gs[0].Error), sqladapters.GroupErrorChars)
	}
	e.noneInUse("long errors")
}
