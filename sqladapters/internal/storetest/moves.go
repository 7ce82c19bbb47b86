package storetest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Moves between the outbox and the tables of dead letters and kept rows:
// the outbox holds only rows that still have to go, and a row moves whole,
// under its id, or not at all.
var moveCases = []testCase{
	{"MovesKeepTheMessage", testMovesKeepTheMessage},
	{"RequeuedRowGoesFirst", testRequeuedRowGoesFirst},
	{"MovesAreAtomic", testMovesAreAtomic},
	{"MovesInTransaction", testMovesInTransaction},
}

// testMovesKeepTheMessage dead-letters, requeues and keeps rows: each
// keeps its id, topic, UUID, payload, metadata, key and creation time in
// every table it passes through.
func testMovesKeepTheMessage(e *env) {
	e.migrated()
	ms := []sqladapters.OutboxMessage{msg("m0", "key", 5), msg("m1", "", 6)}
	ms[0].Payload = []byte{0, 1, 2, 0xff}
	id := e.insert(ms...)
	before := e.pending(sqladapters.PendingQuery{Limit: 10})
	e.kill("gone", id...)
	if n := e.count(e.d.OutboxTable()); n != 0 {
		e.t.Fatalf("%d rows in the outbox after dead-lettering all, want none", n)
	}
	dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10, Payloads: true})
	if len(dls) != 2 {
		e.t.Fatalf("dead letters %+v", dls)
	}
	for i, dl := range dls {
		want := before[i]
		if dl.ID != want.ID || dl.Topic != want.Topic || dl.UUID != want.UUID || !bytes.Equal(dl.Payload, want.Payload) ||
			!bytes.Equal(dl.Metadata, want.Metadata) || dl.Key != want.Key || dl.Attempts != 3 || dl.LastError != "gone" {
			e.t.Fatalf("dead letter %d is %+v, the row was %+v", i, dl, want)
		}
	}
	n, err := e.d.RequeueDeadLetters(e.ctx, e.db, id)
	if err != nil || n != 2 {
		e.t.Fatalf("RequeueDeadLetters: %d, %v", n, err)
	}
	if n := e.count(e.table("_dead")); n != 0 {
		e.t.Fatalf("%d dead letters after requeueing all, want none", n)
	}
	after := e.pending(sqladapters.PendingQuery{Limit: 10})
	for i := range after {
		after[i].Age, before[i].Age = 0, 0
	}
	if !slices.EqualFunc(after, before, func(a, b sqladapters.OutboxRow) bool {
		return a.ID == b.ID && a.Topic == b.Topic && a.UUID == b.UUID && bytes.Equal(a.Payload, b.Payload) &&
			bytes.Equal(a.Metadata, b.Metadata) && a.Key == b.Key && a.Attempts == 0
	}) {
		e.t.Fatalf("requeued rows %+v, were %+v", after, before)
	}
	// Requeued, a row still has its creation time: backdated before it
	// died, it is an hour old in the kept rows' table too.
	e.backdate(id[0], time.Hour)
	_, err = e.d.CompleteForwarded(e.ctx, e.db, id, true)
	e.check(err, "CompleteForwarded keep")
	if n := e.count(e.d.OutboxTable()); n != 0 {
		e.t.Fatalf("%d rows in the outbox after keeping all, want none", n)
	}
	rows, err := e.db.Query(e.ctx, `SELECT id, uuid, payload, created_at < published_at FROM `+e.table("_kept")+` ORDER BY id`)
	e.check(err, "read kept rows")
	var kept []string
	for rows.Next() {
		var kid int64
		var uuid string
		var payload []byte
		var older bool
		e.check(rows.Scan(&kid, &uuid, &payload, &older), "scan kept row")
		if !older || !bytes.Equal(payload, ms[len(kept)].Payload) || kid != id[len(kept)] {
			e.t.Fatalf("kept row %d (%s): payload %q, created before published %v", kid, uuid, payload, older)
		}
		kept = append(kept, uuid)
	}
	rows.Close()
	e.check(rows.Err(), "read kept rows")
	if !slices.Equal(kept, []string{"m0", "m1"}) {
		e.t.Fatalf("kept rows %v", kept)
	}
	e.noneInUse("moves")
}

// testRequeuedRowGoesFirst requeues a row whose key has later rows
// pending: back in the outbox under its id, it is read before them, and a
// read starting after the later rows' ids does not find it (the
// forwarder's head reads do).
func testRequeuedRowGoesFirst(e *env) {
	e.migrated()
	id := e.insert(msg("r0", "k", 1))
	e.kill("boom", id[0])
	later := e.insert(msg("r1", "k", 1), msg("r2", "k", 1))
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, later) {
		e.t.Fatalf("pending with the first row dead: %v, want %v", got, later)
	}
	_, err := e.d.RequeueDeadLetters(e.ctx, e.db, id)
	e.check(err, "RequeueDeadLetters")
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, append(id, later...)) {
		e.t.Fatalf("pending after the requeue: %v, want the requeued row first", got)
	}
	if n, err := e.d.RequeueDeadLetters(e.ctx, e.db, id); err != nil || n != 0 {
		e.t.Fatalf("requeueing a pending row again: %d, %v", n, err)
	}
	// It fails again: it holds its key's later rows back as any row.
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 1, Error: "again", Backoff: time.Hour})
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); len(got) != 0 {
		e.t.Fatalf("pending while the requeued row backs off: %v, want none", got)
	}
	e.noneInUse("requeue order")
}

// moveOf is one move between the tables: setup prepares its row, do moves
// it, from and to name the tables it leaves and enters.
type moveOf struct {
	name     string
	setup    func(id int64)
	do       func(e sqladapters.Executor, id int64) (int64, error)
	from, to string
}

func (e *env) moves() []moveOf {
	return []moveOf{{
		name: "dead-lettering",
		do: func(ex sqladapters.Executor, id int64) (int64, error) {
			return e.d.RecordFailure(e.ctx, ex, sqladapters.Failure{ID: id, Attempts: 3, Error: "boom", Dead: true})
		},
		from: e.d.OutboxTable(), to: e.table("_dead"),
	}, {
		name: "keeping",
		do: func(ex sqladapters.Executor, id int64) (int64, error) {
			return e.d.CompleteForwarded(e.ctx, ex, []int64{id}, true)
		},
		from: e.d.OutboxTable(), to: e.table("_kept"),
	}, {
		name:  "requeueing",
		setup: func(id int64) { e.kill("boom", id) },
		do: func(ex sqladapters.Executor, id int64) (int64, error) {
			return e.d.RequeueDeadLetters(e.ctx, ex, []int64{id})
		},
		from: e.table("_dead"), to: e.d.OutboxTable(),
	}}
}

// where counts the row id in the outbox and the tables of dead letters
// and kept rows.
func (e *env) where(id int64) (outbox, dead, kept int64) {
	e.t.Helper()
	n := func(table string) int64 {
		var c int64
		rows, err := e.db.Query(e.ctx, `SELECT count(*) FROM `+table+` WHERE id = `+fmt.Sprint(id))
		e.check(err, "count "+table)
		defer rows.Close()
		for rows.Next() {
			e.check(rows.Scan(&c), "scan count")
		}
		e.check(rows.Err(), "count "+table)
		return c
	}
	return n(e.d.OutboxTable()), n(e.table("_dead")), n(e.table("_kept"))
}

// testMovesAreAtomic makes the database refuse the delete that ends each
// move, given the database handle and given a transaction: the row stays
// where it was, in one table only, and a transaction stays usable where
// the database allows.
func testMovesAreAtomic(e *env) {
	e.migrated()
	aborts := e.d.Name() == "postgres" // a failed statement aborts the transaction
	for _, m := range e.moves() {
		for _, inTx := range []bool{false, true} {
			id := e.insert(msg("atomic "+m.name+" "+boolText(inTx), "k", 1))[0]
			if m.setup != nil {
				m.setup(id)
			}
			before := [3]int64{}
			before[0], before[1], before[2] = e.where(id)
			var ex sqladapters.Executor = e.db
			var tx sqladapters.Tx
			if inTx {
				var err error
				tx, err = e.db.Begin(e.ctx, sql.TxOptions{})
				e.check(err, "begin")
				ex = tx
			}
			_, err := m.do(refuseDelete(ex, m.from), id)
			if !errors.Is(err, sqladapters.ErrMissingTable) {
				e.t.Fatalf("%s (in a transaction: %v) with its delete refused: %v, want the refused statement's error", m.name, inTx, err)
			}
			if tx != nil {
				if aborts {
					sqladapters.Rollback(tx)
				} else {
					e.check(tx.Commit(e.ctx), m.name+": commit after the refused move")
				}
			}
			var after [3]int64
			after[0], after[1], after[2] = e.where(id)
			if after != before {
				e.t.Fatalf("%s (in a transaction: %v) failed halfway: the row is in outbox, dead, kept %v, was %v", m.name, inTx, after, before)
			}
		}
	}
	e.noneInUse("refused moves")
}

func boolText(b bool) string {
	if b {
		return "tx"
	}
	return "db"
}

// testMovesInTransaction moves rows in the caller's transaction: they move
// with its commit and stay with its rollback.
func testMovesInTransaction(e *env) {
	e.migrated()
	for _, m := range e.moves() {
		for _, commit := range []bool{false, true} {
			id := e.insert(msg(m.name+boolText(commit), "", 0))[0]
			if m.setup != nil {
				m.setup(id)
			}
			var before [3]int64
			before[0], before[1], before[2] = e.where(id)
			tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
			e.check(err, "begin")
			if n, err := m.do(tx, id); err != nil || n != 1 {
				sqladapters.Rollback(tx)
				e.t.Fatalf("%s in a transaction: %d, %v", m.name, n, err)
			}
			if commit {
				e.check(tx.Commit(e.ctx), "commit")
			} else {
				e.check(tx.Rollback(e.ctx), "rollback")
			}
			var after [3]int64
			after[0], after[1], after[2] = e.where(id)
			moved := after != before && after[0]+after[1]+after[2] == 1
			if commit != moved {
				e.t.Fatalf("%s, committed %v: the row is in outbox, dead, kept %v, was %v", m.name, commit, after, before)
			}
		}
	}
	e.noneInUse("moves in a transaction")
}

// refuseDelete runs the statements of e, but sends a delete from table to
// a table that does not exist, so that the database refuses it.
func refuseDelete(e sqladapters.Executor, table string) sqladapters.Executor {
	r := rewriteExec{e: e, rewrite: func(q string) string {
		return strings.Replace(q, "DELETE FROM "+table, "DELETE FROM "+table[:len(table)-1]+"_missing"+table[len(table)-1:], 1)
	}}
	if db, ok := e.(sqladapters.DB); ok {
		return rewriteDB{rewriteExec: r, db: db}
	}
	return r
}

type rewriteExec struct {
	e       sqladapters.Executor
	rewrite func(string) string
}

func (r rewriteExec) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	return r.e.Exec(ctx, r.rewrite(query), args...)
}

func (r rewriteExec) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	return r.e.Query(ctx, r.rewrite(query), args...)
}

// rewriteDB is rewriteExec over a database: its transactions rewrite too.
type rewriteDB struct {
	rewriteExec
	db sqladapters.DB
}

func (r rewriteDB) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	tx, err := r.db.Begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	return rewriteTx{rewriteExec: rewriteExec{e: tx, rewrite: r.rewrite}, tx: tx}, nil
}

type rewriteTx struct {
	rewriteExec
	tx sqladapters.Tx
}

func (r rewriteTx) Commit(ctx context.Context) error   { return r.tx.Commit(ctx) }
func (r rewriteTx) Rollback(ctx context.Context) error { return r.tx.Rollback(ctx) }
