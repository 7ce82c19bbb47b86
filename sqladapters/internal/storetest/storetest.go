// Package storetest is the conformance suite of the store contract,
// sqladapters.Dialect: Run exercises every method of a dialect against a
// real database, through the DB a test gives it, and checks what the
// publisher, the forwarder, the inbox and the operations tools depend on.
// Each database package runs it with every adapter it supports.
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

// Setup is the database one run of the suite uses.
type Setup struct {
	// DB is the database the suite runs on.
	DB sqladapters.DB
	// New returns a dialect whose tables no other test uses, not yet
	// migrated. It removes whatever the test creates in the database
	// after the test (t.Cleanup).
	New func(t *testing.T) sqladapters.Dialect
	// InUse, when set, counts the connections of DB in use, so that the
	// suite can check that no transaction was left open.
	InUse func() int
	// Skip names subtests not to run, each with the reason: a known
	// defect of the adapter, which the skip message reports.
	Skip map[string]string
}

// Run runs the suite, one subtest for each part of the contract. The
// subtests run one after the other, each on tables of its own.
func Run(t *testing.T, s Setup) {
	t.Helper()
	if s.DB == nil || s.New == nil {
		t.Fatal("storetest: Setup needs DB and New")
	}
	for _, c := range []struct {
		name string
		run  func(*env)
	}{
		{"Migrate", testMigrate},
		{"MigrateConcurrent", testMigrateConcurrent},
		{"MissingTable", testMissingTable},
		{"InsertOutbox", testInsertOutbox},
		{"InsertOutboxAtomic", testInsertOutboxAtomic},
		{"ReadPending", testReadPending},
		{"ReadPendingBackoff", testReadPendingBackoff},
		{"ReadPendingBacklog", testReadPendingBacklog},
		{"ReadPendingInTransaction", testReadPendingInTransaction},
		{"CompleteForwarded", testCompleteForwarded},
		{"RecordFailure", testRecordFailure},
		{"OutboxStats", testOutboxStats},
		{"DeadLetters", testDeadLetters},
		{"HighWaterMark", testHighWaterMark},
		{"PendingHorizon", testPendingHorizon},
		{"NotifyProbe", testNotifyProbe},
		{"Partitions", testPartitions},
		{"Members", testMembers},
		{"Leases", testLeases},
		{"LeasesConcurrent", testLeasesConcurrent},
		{"RecordInbox", testRecordInbox},
		{"RecordInboxConcurrent", testRecordInboxConcurrent},
		{"BeginRecordInbox", testBeginRecordInbox},
		{"DeleteInbox", testDeleteInbox},
	} {
		t.Run(c.name, func(t *testing.T) {
			if reason, ok := s.Skip[c.name]; ok {
				t.Skip(reason)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c.run(&env{t: t, ctx: ctx, s: s, db: s.DB})
		})
	}
}

// env is one subtest's view of the database.
type env struct {
	t   *testing.T
	ctx context.Context
	s   Setup
	db  sqladapters.DB
	d   sqladapters.Dialect
}

// migrated gives e a fresh migrated dialect and returns it.
func (e *env) migrated() sqladapters.Dialect {
	e.t.Helper()
	e.d = e.s.New(e.t)
	if err := sqladapters.Migrate(e.ctx, e.db, e.d); err != nil {
		e.t.Fatalf("migrate: %v", err)
	}
	return e.d
}

func (e *env) check(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// noneInUse checks that no connection of the DB is in use, when the setup
// can tell.
func (e *env) noneInUse(after string) {
	e.t.Helper()
	if e.s.InUse == nil {
		return
	}
	if n := e.s.InUse(); n != 0 {
		e.t.Fatalf("%d connections in use after %s: a transaction was left open", n, after)
	}
}

// msg is a message of the suite: its payload and metadata name its uuid.
func msg(uuid, key string, keyHash int32) sqladapters.OutboxMessage {
	return sqladapters.OutboxMessage{
		Topic:    "topic." + uuid,
		UUID:     uuid,
		Payload:  []byte("payload of " + uuid),
		Metadata: []byte(`{"uuid":"` + uuid + `"}`),
		Key:      key,
		KeyHash:  keyHash,
	}
}

// msgs returns n keyless messages named prefix0, prefix1, ..., placed in
// partitions by their position.
func msgs(prefix string, n int) []sqladapters.OutboxMessage {
	out := make([]sqladapters.OutboxMessage, n)
	for i := range out {
		out[i] = msg(fmt.Sprint(prefix, i), "", int32(i))
	}
	return out
}

// insert writes ms in one committed transaction and returns their ids, in
// the order of ms.
func (e *env) insert(ms ...sqladapters.OutboxMessage) []int64 {
	e.t.Helper()
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	if err := e.d.InsertOutbox(e.ctx, tx, ms); err != nil {
		sqladapters.Rollback(tx)
		e.t.Fatalf("InsertOutbox: %v", err)
	}
	e.check(tx.Commit(e.ctx), "commit")
	ids := map[string]int64{}
	for _, r := range e.pending(sqladapters.PendingQuery{Limit: 100000}) {
		ids[r.UUID] = r.ID
	}
	out := make([]int64, len(ms))
	for i, m := range ms {
		id, ok := ids[m.UUID]
		if !ok {
			e.t.Fatalf("message %s inserted but not pending", m.UUID)
		}
		out[i] = id
	}
	return out
}

func (e *env) pending(q sqladapters.PendingQuery) []sqladapters.OutboxRow {
	e.t.Helper()
	rows, err := e.d.ReadPending(e.ctx, e.db, q, false)
	e.check(err, "ReadPending")
	return rows
}

func (e *env) pendingIDs(q sqladapters.PendingQuery) []int64 {
	e.t.Helper()
	return ids(e.pending(q))
}

func ids(rows []sqladapters.OutboxRow) []int64 {
	out := []int64{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// count returns the number of rows in table, by plain SQL all databases
// understand.
func (e *env) count(table string) int64 {
	e.t.Helper()
	rows, err := e.db.Query(e.ctx, `SELECT count(*) FROM `+table)
	e.check(err, "count")
	defer rows.Close()
	var n int64
	for rows.Next() {
		e.check(rows.Scan(&n), "scan count")
	}
	e.check(rows.Err(), "count")
	return n
}

func (e *env) stats() sqladapters.OutboxStats {
	e.t.Helper()
	st, err := e.d.OutboxStats(e.ctx, e.db)
	e.check(err, "OutboxStats")
	return st
}

func (e *env) fail(f sqladapters.Failure) int64 {
	e.t.Helper()
	n, err := e.d.RecordFailure(e.ctx, e.db, f)
	e.check(err, "RecordFailure")
	return n
}

func (e *env) owned(instance string) []int {
	e.t.Helper()
	p, err := e.d.OwnedPartitions(e.ctx, e.db, instance)
	e.check(err, "OwnedPartitions")
	return p
}

func (e *env) members() int {
	e.t.Helper()
	n, err := e.d.CountMembers(e.ctx, e.db)
	e.check(err, "CountMembers")
	return n
}

func (e *env) partitions() int {
	e.t.Helper()
	n, err := e.d.CountPartitions(e.ctx, e.db)
	e.check(err, "CountPartitions")
	return n
}

func (e *env) record(consumer, id string) bool {
	e.t.Helper()
	first, err := e.d.RecordInbox(e.ctx, e.db, consumer, id)
	e.check(err, "RecordInbox")
	return first
}

// testMigrate migrates a fresh dialect twice: the second run finds every
// version applied and changes nothing.
func testMigrate(e *env) {
	d := e.s.New(e.t)
	ms := d.Migrations()
	if len(ms) == 0 {
		e.t.Fatal("no migrations")
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].Version <= ms[i-1].Version {
			e.t.Fatalf("migration %d listed after %d", ms[i].Version, ms[i-1].Version)
		}
	}
	for i := range 2 {
		if err := sqladapters.Migrate(e.ctx, e.db, d); err != nil {
			e.t.Fatalf("migration run %d: %v", i+1, err)
		}
	}
	e.d = d
	e.insert(msg("a", "", 0))
	if err := sqladapters.Migrate(e.ctx, e.db, d); err != nil {
		e.t.Fatalf("migration over data: %v", err)
	}
	if got := e.pending(sqladapters.PendingQuery{Limit: 10}); len(got) != 1 {
		e.t.Fatalf("%d rows pending after migrating again, want 1", len(got))
	}
	e.noneInUse("Migrate")
}

// testMigrateConcurrent migrates one fresh dialect from several
// goroutines at once, as processes starting together do: every one
// succeeds.
func testMigrateConcurrent(e *env) {
	e.d = e.s.New(e.t)
	errs := make(chan error, 3)
	for range cap(errs) {
		go func() { errs <- sqladapters.Migrate(e.ctx, e.db, e.d) }()
	}
	e.check(errors.Join(collect(errs)...), "concurrent Migrate")
	e.insert(msg("a", "", 0))
	e.noneInUse("Migrate")
}

// collect waits for the results of cap(errs) goroutines and returns the
// errors among them.
func collect(errs chan error) []error {
	var out []error
	for range cap(errs) {
		if err := <-errs; err != nil {
			out = append(out, err)
		}
	}
	return out
}

// testMissingTable uses a dialect whose tables were never created: the
// outbox insert, the forwarder's read and the inbox fail with a
// *MissingTableError that says how to create them.
func testMissingTable(e *env) {
	e.d = e.s.New(e.t)
	want := func(op string, err error) {
		e.t.Helper()
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) {
			e.t.Fatalf("%s: want a *MissingTableError, got %v", op, err)
		}
		if mt.Dialect != e.d.Name() {
			e.t.Fatalf("%s: the error names dialect %q, want %q", op, mt.Dialect, e.d.Name())
		}
		if n := strings.Count(err.Error(), "sqladapters.Migrate"); n != 1 {
			e.t.Fatalf("%s: the error says %d times how to migrate: %v", op, n, err)
		}
		// Code running SQL of its own next to millbox's may classify an
		// error twice.
		if again := e.d.ClassifyError(err); again != err {
			e.t.Fatalf("%s: classifying the error again changed it to %v", op, again)
		}
	}
	_, err := e.d.ReadPending(e.ctx, e.db, sqladapters.PendingQuery{Limit: 10}, false)
	want("ReadPending", err)
	_, err = e.d.ReadPending(e.ctx, e.db, sqladapters.PendingQuery{Limit: 10}, true)
	want("ReadPending of a backlog", err)
	want("InsertOutbox", e.d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{msg("a", "", 0)}))
	_, err = e.d.RecordInbox(e.ctx, e.db, "c", "m")
	want("RecordInbox", err)
	tx, first, err := e.d.BeginRecordInbox(e.ctx, e.db, sql.TxOptions{}, "c", "m")
	want("BeginRecordInbox", err)
	if tx != nil || first {
		e.t.Fatalf("BeginRecordInbox failed but returned a transaction (%v) or first (%v)", tx, first)
	}
	e.noneInUse("a failed BeginRecordInbox")
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
		if r.Topic != m.Topic || r.UUID != m.UUID || !bytes.Equal(r.Payload, m.Payload) || r.Key != m.Key || r.Attempts != 0 {
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

// testCompleteForwarded deletes some rows and keeps others stamped: both
// leave the pending rows, only kept ones stay in the table.
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
	if n := e.count(e.d.OutboxTable()); n != 3 {
		e.t.Fatalf("%d rows in the table, want the 2 kept and 1 pending", n)
	}
	if n := complete(id[:1], false); n != 0 {
		e.t.Fatalf("deleting a deleted row changed %d", n)
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
	dls, err := e.d.ListDeadLetters(e.ctx, e.db, 0, 10)
	e.check(err, "ListDeadLetters")
	if len(dls) != 1 || dls[0].ID != id[1] || dls[0].Attempts != 7 || !strings.HasPrefix(dls[0].LastError, "bad ") {
		e.t.Fatalf("dead letters %+v", dls)
	}
	if st := e.stats(); st.Pending != 2 || st.Dead != 1 {
		e.t.Fatalf("stats %+v, want 2 pending (one backing off) and 1 dead", st)
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

// testDeadLetters pages through dead letters and requeues them: nil ids
// requeue every dead row, an empty list none.
func testDeadLetters(e *env) {
	e.migrated()
	id := e.insert(msg("d0", "key", 1), msg("d1", "", 2), msg("d2", "", 3), msg("d3", "", 4), msg("d4", "", 5))
	dead := []int64{id[0], id[1], id[2], id[4]}
	for i, d := range dead {
		e.fail(sqladapters.Failure{ID: d, Attempts: 3, Error: fmt.Sprint("boom ", i), Dead: true})
	}
	list := func(after int64, limit int) []sqladapters.DeadLetter {
		e.t.Helper()
		dls, err := e.d.ListDeadLetters(e.ctx, e.db, after, limit)
		e.check(err, "ListDeadLetters")
		return dls
	}
	all := list(0, 100)
	var got []int64
	for i, dl := range all {
		got = append(got, dl.ID)
		m := msg(fmt.Sprint("d", slices.Index(id, dl.ID)), "", 0)
		if dl.UUID != m.UUID || dl.Topic != m.Topic || !bytes.Equal(dl.Payload, m.Payload) || dl.Attempts != 3 || dl.LastError != fmt.Sprint("boom ", i) {
			e.t.Fatalf("dead letter %d: %+v", i, dl)
		}
		if dl.CreatedAt.IsZero() || dl.DeadAt.IsZero() || dl.DeadAt.Before(dl.CreatedAt) {
			e.t.Fatalf("dead letter %d created %v, dead %v", i, dl.CreatedAt, dl.DeadAt)
		}
	}
	if !slices.Equal(got, dead) {
		e.t.Fatalf("dead letters %v, want %v", got, dead)
	}
	if all[0].Key != "key" || all[1].Key != "" {
		e.t.Fatalf("keys %q %q", all[0].Key, all[1].Key)
	}
	p1, p2 := list(0, 2), list(dead[1], 2)
	if len(p1) != 2 || p1[1].ID != dead[1] || len(p2) != 2 || p2[0].ID != dead[2] || p2[1].ID != dead[3] || len(list(dead[3], 2)) != 0 {
		e.t.Fatalf("pages %v %v", p1, p2)
	}

	requeue := func(ids []int64) int64 {
		e.t.Helper()
		n, err := e.d.RequeueDeadLetters(e.ctx, e.db, ids)
		e.check(err, "RequeueDeadLetters")
		return n
	}
	if n := requeue([]int64{}); n != 0 || e.stats().Dead != 4 {
		e.t.Fatalf("requeueing no ids changed %d rows", n)
	}
	if n := requeue([]int64{dead[0], id[3]}); n != 1 {
		e.t.Fatalf("requeueing one dead and one pending row changed %d", n)
	}
	rows := e.pending(sqladapters.PendingQuery{Limit: 100})
	if got, want := ids(rows), []int64{id[0], id[3]}; !slices.Equal(got, want) || rows[0].Attempts != 0 {
		e.t.Fatalf("pending after requeue: %+v, want %v with no attempts", rows, want)
	}
	if n := requeue(nil); n != 3 {
		e.t.Fatalf("requeueing all changed %d rows, want 3", n)
	}
	if st := e.stats(); st.Dead != 0 || st.Pending != 5 {
		e.t.Fatalf("stats after requeueing all: %+v", st)
	}
	if n := requeue(nil); n != 0 {
		e.t.Fatalf("requeueing with no dead rows changed %d", n)
	}
	e.noneInUse("dead letters")
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

// testPartitions creates lease rows, idempotently and never fewer.
func testPartitions(e *env) {
	e.migrated()
	if n := e.partitions(); n != 0 {
		e.t.Fatalf("%d partitions before EnsurePartitions", n)
	}
	for _, c := range []struct{ ensure, want int }{{4, 4}, {4, 4}, {2, 4}, {7, 7}, {0, 7}} {
		e.check(e.d.EnsurePartitions(e.ctx, e.db, c.ensure), "EnsurePartitions")
		if n := e.partitions(); n != c.want {
			e.t.Fatalf("EnsurePartitions(%d): %d partitions, want %d", c.ensure, n, c.want)
		}
	}
	e.noneInUse("EnsurePartitions")
}

// testMembers counts live instances: a heartbeat adds or extends one,
// RemoveMember deletes one, and an expired one does not count.
func testMembers(e *env) {
	e.migrated()
	beat := func(instance string, ttl time.Duration) {
		e.t.Helper()
		e.check(e.d.Heartbeat(e.ctx, e.db, instance, ttl), "Heartbeat")
	}
	if n := e.members(); n != 0 {
		e.t.Fatalf("%d members before any heartbeat", n)
	}
	long := strings.Repeat("i", 300)
	beat("a", time.Minute)
	beat("b", time.Minute)
	beat("a", time.Minute)
	beat(long, time.Minute)
	if n := e.members(); n != 3 {
		e.t.Fatalf("%d members, want 3", n)
	}
	beat("expired", -time.Hour)
	if n := e.members(); n != 3 {
		e.t.Fatalf("%d members with one expired, want 3", n)
	}
	beat(long, -time.Hour) // an instance whose heartbeat lapsed
	if n := e.members(); n != 2 {
		e.t.Fatalf("%d members after one lapsed, want 2", n)
	}
	e.check(e.d.RemoveMember(e.ctx, e.db, "b"), "RemoveMember")
	e.check(e.d.RemoveMember(e.ctx, e.db, "unknown"), "RemoveMember")
	if n := e.members(); n != 1 {
		e.t.Fatalf("%d members after removing one, want 1", n)
	}
	e.noneInUse("members")
}

// testLeases claims, renews and releases partitions with two instances:
// their leases never overlap, and an expired lease is free.
func testLeases(e *env) {
	e.migrated()
	e.check(e.d.EnsurePartitions(e.ctx, e.db, 4), "EnsurePartitions")
	claim := func(instance string, ttl time.Duration, max int) {
		e.t.Helper()
		e.check(e.d.ClaimPartitions(e.ctx, e.db, instance, ttl, max), "ClaimPartitions")
	}
	release := func(instance string, ps []int) {
		e.t.Helper()
		e.check(e.d.ReleasePartitions(e.ctx, e.db, instance, ps), "ReleasePartitions")
	}
	long := strings.Repeat("b", 300)
	claim("a", time.Minute, 3)
	a := e.owned("a")
	if len(a) != 3 || !slices.IsSorted(a) {
		e.t.Fatalf("a claimed %v, want 3 partitions in order", a)
	}
	claim(long, time.Minute, 3)
	b := e.owned(long)
	if len(b) != 1 || slices.Contains(a, b[0]) {
		e.t.Fatalf("b claimed %v next to a's %v, want the one left", b, a)
	}
	claim("c", time.Minute, 4)
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("c claimed %v with every partition leased", c)
	}
	e.check(e.d.RenewPartitions(e.ctx, e.db, "a", time.Minute), "RenewPartitions")
	if got := e.owned("a"); !slices.Equal(got, a) {
		e.t.Fatalf("a owns %v after renewing, want %v", got, a)
	}
	release("a", nil)
	release("a", []int{})
	release(long, a) // not b's: nothing changes
	if got := e.owned("a"); !slices.Equal(got, a) {
		e.t.Fatalf("a owns %v after b released a's partitions, want %v", got, a)
	}
	release("a", a[:1])
	if got := e.owned("a"); !slices.Equal(got, a[1:]) {
		e.t.Fatalf("a owns %v after releasing %d, want %v", got, a[0], a[1:])
	}
	// A lease that expired at once is not owned and is free to claim.
	claim("c", -time.Hour, 1)
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("c owns %v through an expired lease", c)
	}
	e.check(e.d.RenewPartitions(e.ctx, e.db, "c", time.Minute), "RenewPartitions")
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("renewing revived c's expired lease: %v", c)
	}
	claim(long, time.Minute, 1)
	if got, want := e.owned(long), []int{min(a[0], b[0]), max(a[0], b[0])}; !slices.Equal(got, want) {
		e.t.Fatalf("b owns %v after claiming the expired lease, want %v", got, want)
	}
	if got := e.owned("nobody"); len(got) != 0 {
		e.t.Fatalf("an unknown instance owns %v", got)
	}
	e.noneInUse("leases")
}

// testLeasesConcurrent makes lease rows and claims them from several
// instances at once, as forwarders starting together do: no partition is
// owned twice, and none more than its claimer asked for. A claim may fail
// (a deadlock the database resolves); the next one succeeds.
func testLeasesConcurrent(e *env) {
	e.migrated()
	const instances, partitions, each = 4, 8, 3
	errs := make(chan error, instances)
	for range instances {
		go func() { errs <- e.d.EnsurePartitions(e.ctx, e.db, partitions) }()
	}
	e.check(errors.Join(collect(errs)...), "concurrent EnsurePartitions")
	if n := e.partitions(); n != partitions {
		e.t.Fatalf("%d partitions after concurrent EnsurePartitions(%d)", n, partitions)
	}
	for i := range instances {
		go func() { errs <- e.d.ClaimPartitions(e.ctx, e.db, fmt.Sprint("i", i), time.Minute, each) }()
	}
	for _, err := range collect(errs) {
		e.t.Logf("concurrent ClaimPartitions: %v", err)
	}
	owners := func() map[int]string {
		e.t.Helper()
		owner := map[int]string{}
		for i := range instances {
			instance := fmt.Sprint("i", i)
			owned := e.owned(instance)
			if len(owned) > each {
				e.t.Fatalf("%s owns %v, more than the %d it claimed", instance, owned, each)
			}
			for _, p := range owned {
				if other, ok := owner[p]; ok {
					e.t.Fatalf("partition %d is owned by %s and %s", p, other, instance)
				}
				owner[p] = instance
			}
		}
		return owner
	}
	owner := owners()
	// Each instance tops its leases up to what it wants, one after the
	// other: every partition ends up owned.
	for i := range instances {
		instance := fmt.Sprint("i", i)
		if want := each - len(e.owned(instance)); want > 0 {
			e.check(e.d.ClaimPartitions(e.ctx, e.db, instance, time.Minute, want), "ClaimPartitions")
		}
	}
	if after := owners(); len(after) != partitions {
		e.t.Fatalf("%d of %d partitions owned after every instance claimed (%d after the concurrent claims)", len(after), partitions, len(owner))
	}
	e.noneInUse("leases")
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
