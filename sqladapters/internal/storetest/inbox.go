package storetest

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Inbox: records, duplicates under concurrency, and their deletion.
var inboxCases = []testCase{
	{"RecordInbox", testRecordInbox},
	{"RecordInboxConcurrent", testRecordInboxConcurrent},
	{"BeginRecordInbox", testBeginRecordInbox},
	{"DeleteInbox", testDeleteInbox},
	{"InboxStats", testInboxStats},
}

// testRecordInbox records messages: true the first time, false for a
// duplicate, and nothing of a rolled back transaction.
func testRecordInbox(e *env) {
	e.migrated()
	for _, c := range []struct {
		consumer, id string
		first        bool
	}{
		{"c", "m", true},
		{"c", "m", false},
		{"c2", "m", true},
		{"c", "m2", true},
		{"c", "M", true},
		{"c", "ü-id", true},
		{"c", "ü-id", false},
		{"c", strings.Repeat("x", 700), true},
		{"c", strings.Repeat("x", 700), false},
	} {
		if got := e.record(c.consumer, c.id); got != c.first {
			e.t.Fatalf("%.20s/%.20s: first=%v, want %v", c.consumer, c.id, got, c.first)
		}
	}
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	first, err := e.d.RecordInbox(e.ctx, tx, "c", "rolled back")
	if err != nil || !first {
		sqladapters.Rollback(tx)
		e.t.Fatalf("in a transaction: %v, %v", first, err)
	}
	again, err := e.d.RecordInbox(e.ctx, tx, "c", "rolled back")
	sqladapters.Rollback(tx)
	if err != nil || again {
		e.t.Fatalf("duplicate in the same transaction: first=%v, %v", again, err)
	}
	if !e.record("c", "rolled back") {
		e.t.Fatal("a rolled back record counts as a duplicate")
	}
	e.noneInUse("RecordInbox")
}

// testRecordInboxConcurrent records one message in two transactions at
// once: the second one reports a duplicate if the first committed, and
// records the message if the first rolled back, whichever runs first.
func testRecordInboxConcurrent(e *env) {
	e.migrated()
	// second records the message in a transaction of its own, begun with
	// BeginRecordInbox or before RecordInbox, and commits it.
	second := map[string]func(id string) (bool, error){
		"RecordInbox": func(id string) (bool, error) {
			tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
			if err != nil {
				return false, err
			}
			first, err := e.d.RecordInbox(e.ctx, tx, "c", id)
			if err != nil {
				sqladapters.Rollback(tx)
				return false, err
			}
			return first, tx.Commit(e.ctx)
		},
		"BeginRecordInbox": func(id string) (bool, error) {
			tx, first, err := e.d.BeginRecordInbox(e.ctx, e.db, sql.TxOptions{}, "c", id)
			if err != nil || !first {
				return first, err
			}
			return first, tx.Commit(e.ctx)
		},
	}
	for via, record := range second {
		for _, commit := range []bool{true, false} {
			id := fmt.Sprintf("%s, commit=%v", via, commit)
			first, err := e.db.Begin(e.ctx, sql.TxOptions{})
			e.check(err, "begin")
			if ok, err := e.d.RecordInbox(e.ctx, first, "c", id); err != nil || !ok {
				sqladapters.Rollback(first)
				e.t.Fatalf("%s: first transaction: first=%v, %v", id, ok, err)
			}
			type result struct {
				first bool
				err   error
			}
			started, done := make(chan struct{}), make(chan result, 1)
			go func() {
				close(started)
				ok, err := record(id)
				done <- result{ok, err}
			}()
			<-started
			if commit {
				e.check(first.Commit(e.ctx), "commit")
			} else {
				sqladapters.Rollback(first)
			}
			r := <-done
			if r.err != nil || r.first == commit {
				e.t.Fatalf("%s: second transaction: first=%v, %v", id, r.first, r.err)
			}
			if e.record("c", id) {
				e.t.Fatalf("%s: the message is not recorded after both transactions", id)
			}
		}
	}
	e.noneInUse("RecordInbox")
}

// testBeginRecordInbox begins a transaction holding the record: committed,
// the message is a duplicate; rolled back, it is not. A duplicate leaves
// no transaction open.
func testBeginRecordInbox(e *env) {
	e.migrated()
	begin := func(id string) (sqladapters.Tx, bool) {
		e.t.Helper()
		tx, first, err := e.d.BeginRecordInbox(e.ctx, e.db, sql.TxOptions{}, "c", id)
		e.check(err, "BeginRecordInbox")
		if first != (tx != nil) {
			e.t.Fatalf("BeginRecordInbox returned first=%v with transaction %v", first, tx)
		}
		return tx, first
	}
	tx, first := begin("m")
	if !first {
		e.t.Fatal("the first record is a duplicate")
	}
	// The handler's writes share the transaction.
	if err := e.d.InsertOutbox(e.ctx, tx, []sqladapters.OutboxMessage{msg("out", "", 0)}); err != nil {
		sqladapters.Rollback(tx)
		e.t.Fatal(err)
	}
	e.check(tx.Commit(e.ctx), "commit")
	if _, first := begin("m"); first {
		e.t.Fatal("a committed record is not a duplicate")
	}
	e.noneInUse("a duplicate BeginRecordInbox")
	if e.record("c", "m") {
		e.t.Fatal("RecordInbox does not see the record of BeginRecordInbox")
	}

	tx, first = begin("m2")
	if !first {
		e.t.Fatal("a new record is a duplicate")
	}
	sqladapters.Rollback(tx)
	tx, first = begin("m2")
	if !first {
		e.t.Fatal("a rolled back record counts as a duplicate")
	}
	e.check(tx.Commit(e.ctx), "commit")
	if e.record("c", "m2") {
		e.t.Fatal("the committed record is not a duplicate")
	}
	if n := e.stats().Pending; n != 1 {
		e.t.Fatalf("%d messages pending, want the one written with the record", n)
	}
	e.noneInUse("BeginRecordInbox")
}

// testDeleteInbox deletes old records in batches until none is left.
func testDeleteInbox(e *env) {
	e.migrated()
	const n = 7
	for i := range n {
		e.record("c", fmt.Sprint("m", i))
	}
	del := func(from, before time.Time, limit int) (int64, time.Time) {
		e.t.Helper()
		got, next, err := e.d.DeleteInbox(e.ctx, e.db, from, before, limit)
		e.check(err, "DeleteInbox")
		return got, next
	}
	if got, _ := del(time.Time{}, time.Now().Add(-time.Hour), 100); got != 0 {
		e.t.Fatalf("deleted %d records received after the cutoff", got)
	}
	before := time.Now().Add(time.Hour)
	var (
		from    time.Time
		total   int64
		batches int
	)
	for {
		got, next := del(from, before, 3)
		if got > 3 {
			e.t.Fatalf("a batch of 3 deleted %d", got)
		}
		if next.Before(from) {
			e.t.Fatalf("the next batch starts at %v, before this one's %v", next, from)
		}
		if got == 0 {
			break
		}
		total += got
		from = next
		if batches++; batches > n {
			e.t.Fatalf("%d batches of 3 for %d records", batches, n)
		}
	}
	if total != n {
		e.t.Fatalf("deleted %d records, want %d", total, n)
	}
	if !e.record("c", "m0") {
		e.t.Fatal("a deleted record still counts as a duplicate")
	}
	e.noneInUse("DeleteInbox")
}

// testInboxStats counts each consumer's records with the age of its
// oldest, and the records received before a time.
func testInboxStats(e *env) {
	e.migrated()
	stats := func() []sqladapters.ConsumerStats {
		e.t.Helper()
		cs, err := e.d.InboxStats(e.ctx, e.db)
		e.check(err, "InboxStats")
		return cs
	}
	if cs := stats(); len(cs) != 0 {
		e.t.Fatalf("empty inbox: %+v", cs)
	}
	e.record("shipping", "m1")
	e.record("billing", "m1")
	e.record("billing", "m2")
	cs := stats()
	if len(cs) != 2 || cs[0].Consumer != "billing" || cs[0].Records != 2 || cs[1].Consumer != "shipping" || cs[1].Records != 1 {
		e.t.Fatalf("consumers %+v, want billing with 2 and shipping with 1", cs)
	}
	for _, c := range cs {
		if c.OldestAge < 0 || c.OldestAge > time.Hour {
			e.t.Fatalf("consumer %s: oldest %v", c.Consumer, c.OldestAge)
		}
	}
	for _, c := range []struct {
		before time.Time
		want   int64
	}{{time.Now().Add(time.Hour), 3}, {time.Now().Add(-time.Hour), 0}} {
		n, err := e.d.CountInboxBefore(e.ctx, e.db, c.before)
		e.check(err, "CountInboxBefore")
		if n != c.want {
			e.t.Fatalf("records before %v: %d, want %d", c.before, n, c.want)
		}
	}
	e.noneInUse("InboxStats")
}
