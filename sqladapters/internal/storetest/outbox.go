package storetest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// Outbox writes and their completion: the publisher's insert, the
// forwarder's completion and failure records, stats, the high-water mark
// and notifications.
var outboxCases = []testCase{
	{"InsertOutbox", testInsertOutbox},
	{"InsertOutboxAtomic", testInsertOutboxAtomic},
	{"CompleteForwarded", testCompleteForwarded},
	{"RecordFailure", testRecordFailure},
	{"OutboxStats", testOutboxStats},
	{"HighWaterMark", testHighWaterMark},
	{"NotifyProbe", testNotifyProbe},
}

// testInsertOutbox checks that rows come back as written, in the order of
// the call, with ids that grow with the position and across calls.
func testInsertOutbox(e *env) {
	e.migrated()
	payload := make([]byte, 256)
	for i := range payload {
		payload[i] = byte(i)
	}
	first := []sqladapters.OutboxMessage{
		{Topic: "orders", UUID: "u0", Payload: payload, Metadata: []byte(`{"a":"b","quote":"\"x\""}`), Key: "customer-1", KeyHash: 7},
		{Topic: "orders", UUID: "u1", Payload: []byte{}, Metadata: []byte(`{}`)},
		{Topic: "ünïcode", UUID: "u2", Payload: []byte("x"), Metadata: []byte(`{"k":"ü"}`), Key: "ключ", KeyHash: 2},
	}
	e.check(e.d.InsertOutbox(e.ctx, e.db, nil), "InsertOutbox of nothing")
	ids1 := e.insert(first...)
	ids2 := e.insert(msgs("v", 50)...)
	all := append(slices.Clone(ids1), ids2...)
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			e.t.Fatalf("ids do not grow with the position: %v", all)
		}
	}
	rows := e.pending(sqladapters.PendingQuery{Limit: 1000})
	if !slices.Equal(ids(rows), all) {
		e.t.Fatalf("pending ids %v, want %v", ids(rows), all)
	}
	for i, m := range first {
		r := rows[i]
		if r.Topic != m.Topic || r.UUID != m.UUID || !bytes.Equal(r.Payload, m.Payload) || r.Key != m.Key || r.Attempts != 0 || r.KeyHash != m.KeyHash {
			e.t.Fatalf("row %d read back as %+v, want %+v", i, r, m)
		}
		var got, want map[string]string
		if err := json.Unmarshal(r.Metadata, &got); err != nil {
			e.t.Fatalf("row %d metadata %q: %v", i, r.Metadata, err)
		}
		_ = json.Unmarshal(m.Metadata, &want)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			e.t.Fatalf("row %d metadata %v, want %v", i, got, want)
		}
	}
	if max := e.d.MaxMessageBytes(); max < 0 {
		e.t.Fatalf("MaxMessageBytes %d", max)
	}
	e.noneInUse("InsertOutbox")
}

// testInsertOutboxAtomic makes the database refuse the statement that
// holds the last message of a call: nothing of the call stays in the
// transaction, which stays usable where the database allows.
func testInsertOutboxAtomic(e *env) {
	e.migrated()
	// aborts is true where a failed statement aborts the transaction.
	aborts := e.d.Name() == "postgres"
	b, ok := sqlstore.BuilderOf(e.d)
	if !ok {
		e.t.Fatalf("%T has no SQL builder", e.d)
	}
	// The first statement of a large call holds this many of its messages.
	rowsPerInsert := len(b.InsertOutbox(msgs("SeveralStatements", 20000))[0].Args) / 6

	for _, c := range []struct {
		name string
		n    int // messages before the poisoned one
	}{
		{"OneStatement", 2},
		{"SeveralStatements", rowsPerInsert},
	} {
		e.t.Run(c.name, func(t *testing.T) {
			ms := append(msgs(c.name, c.n), msg(c.name+"poison", "", 0))
			statements := b.InsertOutbox(ms)
			want := 1
			if c.n == rowsPerInsert {
				want = 2
			}
			if len(statements) != want || want == 2 && len(statements[1].Args) >= 12 {
				t.Fatalf("%d messages make %d statements, want %d, the last with the poisoned message alone", len(ms), len(statements), want)
			}
			before := e.count(e.d.OutboxTable())
			tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer sqladapters.Rollback(tx)
			err = e.d.InsertOutbox(e.ctx, poisoned(tx, e.d, ms[len(ms)-1].UUID), ms)
			if !errors.Is(err, sqladapters.ErrMissingTable) {
				t.Fatalf("want the refused statement's error, classified, got %v", err)
			}
			if aborts && len(statements) == 1 {
				// One statement failed outside a savepoint: the
				// transaction is aborted and can only roll back.
				sqladapters.Rollback(tx)
				if n := e.count(e.d.OutboxTable()); n != before {
					t.Fatalf("%d rows after the rolled back insert, want %d", n, before)
				}
				return
			}
			after := msg(c.name+"after", "", 0)
			if err := e.d.InsertOutbox(e.ctx, tx, []sqladapters.OutboxMessage{after}); err != nil {
				t.Fatalf("the transaction is unusable after the failed insert: %v", err)
			}
			if err := tx.Commit(e.ctx); err != nil {
				t.Fatalf("commit after the failed insert: %v", err)
			}
			if n := e.count(e.d.OutboxTable()); n != before+1 {
				t.Fatalf("%d rows after the commit, want %d: rows of the failed call stayed", n, before+1)
			}
			rows := e.pending(sqladapters.PendingQuery{Limit: 10})
			if len(rows) != 1 || rows[0].UUID != after.UUID {
				t.Fatalf("pending after the commit: %+v, want only %s", rows, after.UUID)
			}
			e.check(func() error { _, err := e.d.CompleteForwarded(e.ctx, e.db, ids(rows), false); return err }(), "CompleteForwarded")
		})
	}
	e.noneInUse("InsertOutbox")
}

// poisoned runs the statements of e, but sends the one binding the
// message poison to a table that does not exist, so that the database
// refuses it.
func poisoned(e sqladapters.Executor, d sqladapters.Dialect, poison string) sqladapters.Executor {
	t := d.OutboxTable()
	return poisonExec{e: e, poison: poison, table: t, missing: t[:len(t)-1] + "_missing" + t[len(t)-1:]}
}

type poisonExec struct {
	e                      sqladapters.Executor
	poison, table, missing string
}

func (p poisonExec) rewrite(query string, args []any) string {
	for _, a := range args {
		if s, ok := a.(string); ok && s == p.poison {
			return strings.Replace(query, p.table, p.missing, 1)
		}
	}
	return query
}

func (p poisonExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return p.e.Exec(ctx, p.rewrite(query, args), args...)
}

func (p poisonExec) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	return p.e.Query(ctx, p.rewrite(query, args), args...)
}

// testCompleteForwarded deletes some rows and keeps others: both leave the
// outbox, the kept ones move to the kept rows' table.
func testCompleteForwarded(e *env) {
	e.migrated()
	id := e.insert(msgs("c", 5)...)
	complete := func(ids []int64, keep bool) int64 {
		e.t.Helper()
		n, err := e.d.CompleteForwarded(e.ctx, e.db, ids, keep)
		e.check(err, "CompleteForwarded")
		return n
	}
	if n := complete(nil, false); n != 0 {
		e.t.Fatalf("completing no ids changed %d rows", n)
	}
	if n := complete([]int64{}, true); n != 0 {
		e.t.Fatalf("completing no ids changed %d rows", n)
	}
	if n := complete(id[:2], false); n != 2 {
		e.t.Fatalf("deleting 2 rows changed %d", n)
	}
	if n := complete(id[2:4], true); n != 2 {
		e.t.Fatalf("keeping 2 rows changed %d", n)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 100}); !slices.Equal(got, id[4:]) {
		e.t.Fatalf("pending after completion: %v, want %v", got, id[4:])
	}
	if n := e.count(e.d.OutboxTable()); n != 1 {
		e.t.Fatalf("%d rows in the outbox, want the 1 pending", n)
	}
	if n := e.count(e.table("_kept")); n != 2 {
		e.t.Fatalf("%d rows in the kept rows' table, want 2", n)
	}
	if n := complete(id[:1], false); n != 0 {
		e.t.Fatalf("deleting a deleted row changed %d", n)
	}
	if n := complete(id[2:3], true); n != 0 {
		e.t.Fatalf("keeping a kept row again changed %d", n)
	}
	if n := e.count(e.table("_kept")); n != 2 {
		e.t.Fatalf("%d rows in the kept rows' table after keeping one again, want 2", n)
	}
	if st := e.stats(); st.Pending != 1 || st.Dead != 0 {
		e.t.Fatalf("stats %+v, want 1 pending", st)
	}
	e.noneInUse("CompleteForwarded")
}

// testRecordFailure stores failures with a backoff and as dead letters.
func testRecordFailure(e *env) {
	e.migrated()
	id := e.insert(msgs("f", 3)...)
	long := strings.Repeat("é", 40000) // longer than some databases keep
	if n := e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "timeout", Backoff: time.Hour}); n != 1 {
		e.t.Fatalf("RecordFailure changed %d rows", n)
	}
	if n := e.fail(sqladapters.Failure{ID: id[1], Attempts: 7, Error: "bad " + long, Dead: true}); n != 1 {
		e.t.Fatalf("RecordFailure of a dead row changed %d rows", n)
	}
	if n := e.fail(sqladapters.Failure{ID: id[2] + 1000, Attempts: 1, Error: "gone"}); n != 0 {
		e.t.Fatalf("RecordFailure of a missing row changed %d rows", n)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 100}); !slices.Equal(got, id[2:]) {
		e.t.Fatalf("pending %v, want %v (one backing off, one dead)", got, id[2:])
	}
	dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10})
	if len(dls) != 1 || dls[0].ID != id[1] || dls[0].Attempts != 7 || !strings.HasPrefix(dls[0].LastError, "bad ") {
		e.t.Fatalf("dead letters %+v", dls)
	}
	if st := e.stats(); st.Pending != 2 || st.Dead != 1 {
		e.t.Fatalf("stats %+v, want 2 pending (one backing off) and 1 dead", st)
	}
	if n, dead := e.count(e.d.OutboxTable()), e.count(e.table("_dead")); n != 2 || dead != 1 {
		e.t.Fatalf("%d rows in the outbox and %d dead letters, want 2 and 1: the dead row moves out", n, dead)
	}
	if n := e.fail(sqladapters.Failure{ID: id[1], Attempts: 8, Error: "again", Dead: true}); n != 0 {
		e.t.Fatalf("RecordFailure of a row dead already changed %d rows", n)
	}
	e.noneInUse("RecordFailure")
}

// testOutboxStats counts pending and dead rows and the oldest age.
func testOutboxStats(e *env) {
	e.migrated()
	if st := e.stats(); st != (sqladapters.OutboxStats{}) {
		e.t.Fatalf("empty outbox: %+v", st)
	}
	id := e.insert(msgs("s", 4)...)
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "x", Backoff: time.Hour})
	e.fail(sqladapters.Failure{ID: id[1], Attempts: 1, Error: "x", Dead: true})
	st := e.stats()
	if st.Pending != 3 || st.Dead != 1 {
		e.t.Fatalf("stats %+v, want 3 pending and 1 dead", st)
	}
	if st.OldestPendingAge < 0 {
		e.t.Fatalf("the database cannot tell the oldest age: %v", st.OldestPendingAge)
	}
	_, err := e.d.CompleteForwarded(e.ctx, e.db, []int64{id[0], id[2], id[3]}, false)
	e.check(err, "CompleteForwarded")
	if st := e.stats(); st.Pending != 0 || st.Dead != 1 || st.OldestPendingAge != 0 {
		e.t.Fatalf("stats %+v, want only 1 dead and no age", st)
	}
	e.noneInUse("OutboxStats")
}

// testHighWaterMark checks that the mark grows with every insert, or that
// it is reported unsupported.
func testHighWaterMark(e *env) {
	e.migrated()
	mark := func() int64 {
		e.t.Helper()
		n, err := e.d.HighWaterMark(e.ctx, e.db)
		e.check(err, "HighWaterMark")
		return n
	}
	if !e.d.Features().HighWaterMark {
		if _, err := e.d.HighWaterMark(e.ctx, e.db); !errors.Is(err, errors.ErrUnsupported) {
			e.t.Fatalf("want errors.ErrUnsupported, got %v", err)
		}
		return
	}
	last := mark()
	for i := range 3 {
		id := e.insert(msg(fmt.Sprint("h", i), "", 0))
		if m := mark(); m <= last {
			e.t.Fatalf("insert %d: the mark stayed at %d (was %d)", i, m, last)
		} else {
			last = m
		}
		_, err := e.d.CompleteForwarded(e.ctx, e.db, id, i == 1)
		e.check(err, "CompleteForwarded")
	}
	e.noneInUse("HighWaterMark")
}

// testNotifyProbe checks that the probe notifies where the dialect
// notifies, and is unsupported where it does not.
func testNotifyProbe(e *env) {
	e.migrated()
	err := e.d.NotifyProbe(e.ctx, e.db)
	if e.d.NotifyChannel() == "" {
		if !errors.Is(err, errors.ErrUnsupported) {
			e.t.Fatalf("want errors.ErrUnsupported, got %v", err)
		}
		return
	}
	e.check(err, "NotifyProbe")
}
