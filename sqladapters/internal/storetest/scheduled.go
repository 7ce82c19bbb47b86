package storetest

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Scheduled messages: the insert of messages with a due time into the
// scheduled table, and their move into the outbox once due.
var scheduledCases = []testCase{
	{"InsertScheduled", testInsertScheduled},
	{"MoveDue", testMoveDue},
	{"MoveDueConcurrent", testMoveDueConcurrent},
	{"MoveDueConcurrentKeepsKeyOrder", testMoveDueConcurrentKeepsKeyOrder},
	{"ScheduledInTransaction", testScheduledInTransaction},
}

// due returns m due at t.
func due(m sqladapters.OutboxMessage, t time.Time) sqladapters.OutboxMessage {
	m.DueAt = t
	return m
}

// moveDue moves what is due at now and checks the call.
func (e *env) moveDue(now time.Time, limit int) (int64, time.Time) {
	e.t.Helper()
	n, next, err := e.d.MoveDue(e.ctx, e.db, now, limit)
	e.check(err, "MoveDue")
	return n, next
}

// write writes ms in one committed transaction.
func (e *env) write(ms ...sqladapters.OutboxMessage) {
	e.t.Helper()
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	if err := e.d.InsertOutbox(e.ctx, tx, ms); err != nil {
		sqladapters.Rollback(tx)
		e.t.Fatalf("InsertOutbox: %v", err)
	}
	e.check(tx.Commit(e.ctx), "commit")
}

// jsonEqual tells whether two JSON objects of strings hold the same
// fields.
func jsonEqual(a, b []byte) bool {
	var x, y map[string]string
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return maps.Equal(x, y)
}

// pendingUUIDs returns the uuids of the pending rows, in id order.
func (e *env) pendingUUIDs() []string {
	e.t.Helper()
	var out []string
	for _, r := range e.pending(sqladapters.PendingQuery{Limit: 100000}) {
		out = append(out, r.UUID)
	}
	return out
}

// testInsertScheduled writes messages with and without a due time in one
// call: only those without are pending; the others are counted as
// scheduled, with the earliest due time, to the microsecond.
func testInsertScheduled(e *env) {
	e.migrated()
	base := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	e.write(msg("now-0", "k", 1), due(msg("later-0", "k", 1), base.Add(time.Minute)), due(msg("later-1", "", 2), base), msg("now-1", "", 3))
	if got := e.pendingUUIDs(); !slices.Equal(got, []string{"now-0", "now-1"}) {
		e.t.Fatalf("pending %v, want only the messages without a due time", got)
	}
	st := e.stats()
	if st.Pending != 2 || st.Scheduled != 2 || !st.NextDue.Equal(base) {
		e.t.Fatalf("stats %+v, want 2 pending, 2 scheduled, next due %v", st, base)
	}
	ts, err := e.d.TopicStats(e.ctx, e.db)
	e.check(err, "TopicStats")
	var scheduled int64
	for _, t := range ts {
		scheduled += t.Scheduled
		if t.Topic == "topic.later-1" && (t.Scheduled != 1 || !t.NextDue.Equal(base)) {
			e.t.Fatalf("topic stats %+v, want 1 scheduled due %v", t, base)
		}
	}
	if scheduled != 2 {
		e.t.Fatalf("topic stats %+v, want 2 scheduled in all", ts)
	}
	if n, next := e.moveDue(base.Add(-time.Microsecond), 100); n != 0 || !next.Equal(base) {
		e.t.Fatalf("move a microsecond before the first due time: %d moved, next %v; want none moved, next %v", n, next, base)
	}
	// A due time between microseconds is stored rounded up: never due
	// before its time.
	e.write(due(msg("between", "", 4), base.Add(-time.Second+time.Nanosecond)))
	if n, _ := e.moveDue(base.Add(-time.Second), 100); n != 0 {
		e.t.Fatal("a message due a nanosecond after the move's time was moved")
	}
	if n, _ := e.moveDue(base.Add(-time.Second+time.Microsecond), 100); n != 1 {
		e.t.Fatalf("the message due within the next microsecond moved %d times, want 1", n)
	}
	e.noneInUse("InsertScheduled")
}

// testMoveDue moves due messages into the outbox: earliest due first,
// messages due at the same time in the order they were written, after the
// rows the outbox already holds, whole (topic, payload, metadata, key and
// key hash), at most limit a call; the rest stays scheduled.
func testMoveDue(e *env) {
	e.migrated()
	t0 := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	e.insert(msg("first", "k", 7))
	e.write(due(msg("b", "k", 7), t0.Add(time.Second)), due(msg("a", "k", 7), t0), due(msg("c", "k", 7), t0.Add(time.Second)))
	e.write(due(msg("d", "", 3), t0.Add(time.Second)), due(msg("z", "", 4), t0.Add(time.Hour)))
	e.insert(msg("second", "k", 7))

	n, next := e.moveDue(t0, 100)
	if n != 1 || !next.Equal(t0.Add(time.Second)) {
		e.t.Fatalf("move at the first due time: %d moved, next %v; want 1, %v", n, next, t0.Add(time.Second))
	}
	if n, _ := e.moveDue(t0.Add(time.Second), 2); n != 2 {
		e.t.Fatalf("move with limit 2: %d moved", n)
	}
	if n, next := e.moveDue(t0.Add(time.Minute), 100); n != 1 || !next.Equal(t0.Add(time.Hour)) {
		e.t.Fatalf("move of the last due one: %d moved, next %v", n, next)
	}
	want := []string{"first", "second", "a", "b", "c", "d"}
	if got := e.pendingUUIDs(); !slices.Equal(got, want) {
		e.t.Fatalf("pending %v, want %v", got, want)
	}
	rows := e.pending(sqladapters.PendingQuery{Limit: 100})
	for _, r := range rows[2:] {
		m := msg(r.UUID, r.Key, r.KeyHash)
		if r.Topic != m.Topic || !bytes.Equal(r.Payload, m.Payload) || r.Attempts != 0 || !jsonEqual(r.Metadata, m.Metadata) {
			e.t.Fatalf("moved row %+v, want the message %+v", r, m)
		}
	}
	if rows[2].Key != "k" || rows[2].KeyHash != 7 || rows[5].Key != "" || rows[5].KeyHash != 3 {
		e.t.Fatalf("moved rows lost their keys: %+v", rows[2:])
	}
	if st := e.stats(); st.Pending != 6 || st.Scheduled != 1 || !st.NextDue.Equal(t0.Add(time.Hour)) {
		e.t.Fatalf("stats %+v, want 6 pending and 1 scheduled", st)
	}
	if n, next := e.moveDue(t0.Add(2*time.Hour), 100); n != 1 || !next.IsZero() {
		e.t.Fatalf("move of the rest: %d moved, next %v; want 1 and none left", n, next)
	}
	if n, next := e.moveDue(t0.Add(2*time.Hour), 100); n != 0 || !next.IsZero() {
		e.t.Fatalf("move of nothing: %d moved, next %v", n, next)
	}
	e.noneInUse("MoveDue")
}

// testMoveDueConcurrent moves from several goroutines at once, as the
// forwarder instances of a fleet do: every message lands in the outbox
// exactly once.
func testMoveDueConcurrent(e *env) {
	e.migrated()
	t0 := time.Now().Add(-time.Second)
	const n = 300
	ms := make([]sqladapters.OutboxMessage, n)
	for i := range ms {
		ms[i] = due(msg(fmt.Sprint("m", i), "", int32(i)), t0.Add(time.Duration(i)*time.Microsecond))
	}
	e.write(ms...)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		moved int64
		errs  []error
	)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k, _, err := e.d.MoveDue(e.ctx, e.db, time.Now(), 7)
				mu.Lock()
				moved += k
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil || k == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("concurrent moves failed: %v", errs)
	}
	got := e.pendingUUIDs()
	if moved != n || len(got) != n {
		e.t.Fatalf("%d reported moved and %d rows pending, want %d", moved, len(got), n)
	}
	slices.Sort(got)
	if len(slices.Compact(got)) != n {
		e.t.Fatal("a message was moved twice")
	}
	if st := e.stats(); st.Scheduled != 0 {
		e.t.Fatalf("%d still scheduled", st.Scheduled)
	}
	e.noneInUse("MoveDue")
}

// testMoveDueConcurrentKeepsKeyOrder moves thousands of due messages of
// a few keys, with equal and increasing due times, from four movers at
// once, as the forwarder instances of a fleet do: in the outbox's id
// order, which is the order the forwarder sends a key's rows in, each key's
// messages are in due order, and messages due at the same time in the
// order they were published.
func testMoveDueConcurrentKeepsKeyOrder(e *env) {
	e.migrated()
	const (
		n       = 3000
		keys    = 5
		movers  = 4
		perMove = 20
	)
	// Due times an hour ago and before, so that every message is due:
	// message i is due at one of 300 times, which the publish order visits
	// out of order, and every time is shared by several messages of a key.
	t0 := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	ms := make([]sqladapters.OutboxMessage, n)
	dueOf := map[string]time.Time{}
	for i := range ms {
		key := fmt.Sprint("k", i%keys)
		at := t0.Add(-time.Duration((i*7919)%300) * time.Millisecond)
		ms[i] = due(msg(fmt.Sprint("m", i), key, int32(i%keys)), at)
		dueOf[ms[i].UUID] = at
	}
	e.write(ms...)
	// Each key's messages in due order, equal due times in publish order.
	want := map[string][]string{}
	sorted := slices.Clone(ms)
	slices.SortStableFunc(sorted, func(a, b sqladapters.OutboxMessage) int { return a.DueAt.Compare(b.DueAt) })
	for _, m := range sorted {
		want[m.Key] = append(want[m.Key], m.UUID)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		moved int64
		errs  []error
		start = make(chan struct{})
	)
	for range movers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for {
				k, _, err := e.d.MoveDue(e.ctx, e.db, time.Now(), perMove)
				mu.Lock()
				moved += k
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil || k == 0 {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		e.t.Fatalf("concurrent moves failed: %v", errs)
	}
	rows := e.pending(sqladapters.PendingQuery{Limit: 100000})
	if moved != n || len(rows) != n {
		e.t.Fatalf("%d reported moved and %d rows pending, want %d", moved, len(rows), n)
	}
	got := map[string][]string{}
	for _, r := range rows {
		got[r.Key] = append(got[r.Key], r.UUID)
	}
	for key, w := range want {
		g := got[key]
		for i := range w {
			if i >= len(g) || g[i] != w[i] {
				var at string
				if i < len(g) {
					at = fmt.Sprintf("%s due %v", g[i], dueOf[g[i]].Sub(t0))
				}
				e.t.Fatalf("key %s: message %d in id order is %s, want %s due %v: concurrent moves took the key's messages out of due order",
					key, i, at, w[i], dueOf[w[i]].Sub(t0))
			}
		}
	}
	e.noneInUse("MoveDue")
}

// testScheduledInTransaction writes and moves scheduled messages in a
// caller's transaction: rolled back, nothing of either stays.
func testScheduledInTransaction(e *env) {
	e.migrated()
	t0 := time.Now().Add(-time.Minute)
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	e.check(e.d.InsertOutbox(e.ctx, tx, []sqladapters.OutboxMessage{msg("now", "", 1), due(msg("later", "", 2), t0.Add(time.Hour))}), "InsertOutbox")
	sqladapters.Rollback(tx)
	if st := e.stats(); st.Pending != 0 || st.Scheduled != 0 {
		e.t.Fatalf("stats after a rollback %+v, want nothing", st)
	}
	e.write(due(msg("due", "", 1), t0))
	tx, err = e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	if n, _, err := e.d.MoveDue(e.ctx, tx, time.Now(), 10); err != nil || n != 1 {
		sqladapters.Rollback(tx)
		e.t.Fatalf("MoveDue in a transaction: %d, %v", n, err)
	}
	sqladapters.Rollback(tx)
	if st := e.stats(); st.Pending != 0 || st.Scheduled != 1 {
		e.t.Fatalf("stats after a rolled back move %+v, want the message still scheduled", st)
	}
	e.noneInUse("ScheduledInTransaction")
}

// testMigrateScheduled migrates an installation of the version before
// scheduled messages, holding pending rows, to the latest: the rows stay,
// scheduled messages work, and the version's statements run again change
// nothing.
func testMigrateScheduled(e *env) {
	d, rest := e.migrateTo(7)
	if len(rest) == 0 || rest[0].Version != 7 {
		e.t.Fatalf("versions after 6: %+v, want 7 first", rest)
	}
	e.check(d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{msg("before", "", 1)}), "InsertOutbox")
	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate to the latest version")
	e.write(due(msg("later", "", 2), time.Now().Add(-time.Second)))
	for range 2 {
		tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
		e.check(err, "begin")
		for _, stmt := range rest[0].Statements {
			if _, err := tx.Exec(e.ctx, stmt); err != nil {
				sqladapters.Rollback(tx)
				e.t.Fatalf("version 7's statement again: %v\n%s", err, stmt)
			}
		}
		e.check(tx.Commit(e.ctx), "commit")
	}
	if st := e.stats(); st.Pending != 1 || st.Scheduled != 1 {
		e.t.Fatalf("stats after the migration %+v, want 1 pending and 1 scheduled", st)
	}
	if n, _ := e.moveDue(time.Now(), 10); n != 1 {
		e.t.Fatalf("moved %d after the migration, want 1", n)
	}
	if got := e.pendingUUIDs(); !slices.Equal(got, []string{"before", "later"}) {
		e.t.Fatalf("pending after the migration %v", got)
	}
	e.noneInUse("Migrate")
}
