package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/sqladapters"
)

var logicalCases = []testCase{
	{"Unsupported", testLogicalUnsupported},
	{"SetupAndDrop", testLogicalSetupAndDrop},
	{"ReadKeys", testLogicalReadKeys},
	{"ReadKeysHeld", testLogicalReadKeysHeld},
	{"CompleteStreamed", testLogicalCompleteStreamed},
	{"Emit", testLogicalEmit},
	{"WriteMessages", testLogicalWriteMessages},
}

// logical returns the change-data-capture store of a fresh migrated
// dialect, or skips where the database has none.
func (e *env) logical() sqladapters.Logical {
	e.t.Helper()
	d := e.migrated()
	lg := d.Logical()
	if !d.Features().LogicalReplication {
		e.t.Skipf("%s cannot stream its changes", d.Name())
	}
	if lg == nil {
		e.t.Fatal("Features().LogicalReplication is true but Logical() is nil")
	}
	return lg
}

// testLogicalUnsupported: where the database cannot stream its changes,
// the dialect says so and has no statements for it.
func testLogicalUnsupported(e *env) {
	d := e.migrated()
	if !d.Features().LogicalReplication && d.Logical() != nil {
		e.t.Fatal("Logical() is not nil where Features().LogicalReplication is false")
	}
}

// slotName is a name no other test uses, valid for a slot and a
// publication.
func slotName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "mbst_" + hex.EncodeToString(b)
}

// testLogicalSetupAndDrop: Check tells what exists; creating the
// publication and the slot twice is harmless; Slot reads the slot; Drop
// removes both, twice as well.
func testLogicalSetupAndDrop(e *env) {
	lg := e.logical()
	name := slotName()
	st, err := lg.Check(e.ctx, e.db, name, name)
	e.check(err, "Check")
	if st.TableOID == 0 || st.Publication || st.Slot || st.Role == "" {
		e.t.Fatalf("before setup: %+v; want the table, no publication, no slot, a role", st)
	}
	if st.WalLevel != "logical" {
		if os.Getenv("CI") == "true" {
			e.t.Fatalf("wal_level is %q: the slot cases need logical", st.WalLevel)
		}
		e.t.Skipf("wal_level is %q, not logical", st.WalLevel)
	}
	e.t.Cleanup(func() { _ = lg.Drop(context.Background(), e.db, name, name) })
	for range 2 {
		e.check(lg.CreatePublication(e.ctx, e.db, name), "CreatePublication")
		e.check(lg.CreateSlot(e.ctx, e.db, name, false), "CreateSlot")
	}
	st, err = lg.Check(e.ctx, e.db, name, name)
	e.check(err, "Check")
	if !st.Publication || !st.Slot {
		e.t.Fatalf("after setup: %+v; want the publication and the slot", st)
	}
	slot, ok, err := lg.Slot(e.ctx, e.db, name)
	e.check(err, "Slot")
	if !ok || slot.Confirmed == 0 || slot.Active || slot.Lag < 0 {
		e.t.Fatalf("slot %+v (found %v); want one confirmed at a position, idle", slot, ok)
	}
	if _, ok, err := lg.Slot(e.ctx, e.db, name+"_none"); err != nil || ok {
		e.t.Fatalf("a slot that does not exist: found %v, %v", ok, err)
	}
	for range 2 {
		e.check(lg.Drop(e.ctx, e.db, name, name), "Drop")
	}
	st, err = lg.Check(e.ctx, e.db, name, name)
	e.check(err, "Check")
	if st.Publication || st.Slot {
		e.t.Fatalf("after Drop: %+v", st)
	}
}

// testLogicalReadKeys: the keys with pending rows and the rows of given
// keys in id order with their retry state, each with the mark of its
// snapshot.
func testLogicalReadKeys(e *env) {
	lg := e.logical()
	mark, keys, err := lg.PendingKeys(e.ctx, e.db, false)
	e.check(err, "PendingKeys")
	if len(keys) != 0 || mark.LSN == 0 || mark.XMin == 0 {
		e.t.Fatalf("empty outbox: mark %+v, keys %v", mark, keys)
	}
	id := e.insert(msg("a0", "a", 1), msg("b0", "b", 2), msg("u0", "", 3), msg("a1", "a", 1), msg("a2", "a", 1))
	n, err := e.d.RecordFailure(e.ctx, e.db, sqladapters.Failure{ID: id[0], Attempts: 1, Error: "down", Backoff: time.Hour})
	if err != nil || n != 1 {
		e.t.Fatalf("RecordFailure: %d, %v", n, err)
	}
	_, keys, err = lg.PendingKeys(e.ctx, e.db, false)
	e.check(err, "PendingKeys")
	slices.SortFunc(keys, func(x, y sqladapters.StreamKey) int {
		if x.Key < y.Key {
			return -1
		}
		if x.Key > y.Key {
			return 1
		}
		return 0
	})
	want := []sqladapters.StreamKey{{Key: "", Keyed: false}, {Key: "a", Keyed: true}, {Key: "b", Keyed: true}}
	if !slices.Equal(keys, want) {
		e.t.Fatalf("pending keys %+v, want %+v", keys, want)
	}

	later, rows, err := lg.ReadKeys(e.ctx, e.db, []string{"a"}, false, 10, false)
	e.check(err, "ReadKeys")
	if later.LSN < mark.LSN {
		e.t.Fatalf("marks went back: %+v after %+v", later, mark)
	}
	if len(rows) != 3 || rows[0].ID != id[0] || rows[1].ID != id[3] || rows[2].ID != id[4] {
		e.t.Fatalf("rows of key a: %+v", rows)
	}
	if rows[0].Due || rows[0].Wait < 30*time.Minute || rows[0].Attempts != 1 || !rows[1].Due || !rows[0].Keyed {
		e.t.Fatalf("retry state of key a: %+v", rows)
	}
	if string(rows[1].Payload) != "payload of a1" || rows[1].Topic != "topic.a1" || rows[1].UUID != "a1" || rows[1].Key != "a" {
		e.t.Fatalf("row a1 read as %+v", rows[1].OutboxRow)
	}
	_, rows, err = lg.ReadKeys(e.ctx, e.db, []string{"a", "b"}, true, 2, false)
	e.check(err, "ReadKeys")
	if len(rows) != 2 || rows[0].ID != id[0] || rows[1].ID != id[1] {
		e.t.Fatalf("two rows of keys a, b and none: %+v", rows)
	}
	_, rows, err = lg.ReadKeys(e.ctx, e.db, nil, true, 10, false)
	e.check(err, "ReadKeys")
	if len(rows) != 1 || rows[0].ID != id[2] || rows[0].Keyed {
		e.t.Fatalf("rows without a key: %+v", rows)
	}
	_, rows, err = lg.ReadKeys(e.ctx, e.db, []string{`"quoted", {key}\`}, false, 10, false)
	e.check(err, "ReadKeys of an odd key")
	if len(rows) != 0 {
		e.t.Fatalf("rows of a key nobody wrote: %+v", rows)
	}

	e.noneInUse("ReadKeys")
}

// testLogicalReadKeysHeld: with holds, the keys held by dead letters are
// pending keys, with pending rows or without, and the read of a held key
// returns its dead letter among its rows, in id order, marked as holding;
// without holds, neither. A message written as a dead letter that holds
// its key holds it too.
func testLogicalReadKeysHeld(e *env) {
	lg := e.logical()
	id := e.insert(msg("a0", "a", 1), msg("a1", "a", 1), msg("a2", "a", 1), msg("c0", "c", 2), msg("u0", "", 3))
	e.fail(sqladapters.Failure{ID: id[1], Attempts: 3, Error: "refused", Dead: true, Hold: true})
	e.fail(sqladapters.Failure{ID: id[3], Attempts: 3, Error: "refused", Dead: true, Hold: true})
	e.fail(sqladapters.Failure{ID: id[4], Attempts: 3, Error: "refused", Dead: true})
	keysOf := func(holds bool) []sqladapters.StreamKey {
		e.t.Helper()
		_, keys, err := lg.PendingKeys(e.ctx, e.db, holds)
		e.check(err, "PendingKeys")
		slices.SortFunc(keys, func(x, y sqladapters.StreamKey) int { return strings.Compare(x.Key, y.Key) })
		return keys
	}
	if got, want := keysOf(true), []sqladapters.StreamKey{{Key: "a", Keyed: true}, {Key: "c", Keyed: true}}; !slices.Equal(got, want) {
		e.t.Fatalf("pending keys with holds %+v, want %+v (c held without pending rows)", got, want)
	}
	if got, want := keysOf(false), []sqladapters.StreamKey{{Key: "a", Keyed: true}}; !slices.Equal(got, want) {
		e.t.Fatalf("pending keys without holds %+v, want %+v", got, want)
	}
	read := func(holds bool) []sqladapters.KeyedRow {
		e.t.Helper()
		_, rows, err := lg.ReadKeys(e.ctx, e.db, []string{"a", "c"}, true, 10, holds)
		e.check(err, "ReadKeys")
		return rows
	}
	rows := read(true)
	if len(rows) != 4 || rows[0].ID != id[0] || rows[0].Holds || rows[1].ID != id[1] || !rows[1].Holds || rows[1].Key != "a" ||
		rows[2].ID != id[2] || rows[2].Holds || rows[3].ID != id[3] || !rows[3].Holds || rows[3].Key != "c" {
		e.t.Fatalf("rows of held keys: %+v", rows)
	}
	if rows := read(false); len(rows) != 2 || rows[0].ID != id[0] || rows[1].ID != id[2] || rows[0].Holds || rows[1].Holds {
		e.t.Fatalf("rows of the keys without holds: %+v", rows)
	}
	_, err := lg.WriteMessages(e.ctx, e.db, []sqladapters.WrittenMessage{{OutboxMessage: msg("w0", "w", 4), ID: id[4] + 100, Created: time.Now(),
		Failure: &sqladapters.Failure{Attempts: 3, Error: "refused", Dead: true, Hold: true}}})
	e.check(err, "WriteMessages")
	if got := keysOf(true); len(got) != 3 || got[2].Key != "w" {
		e.t.Fatalf("pending keys with a written dead letter that holds: %+v", got)
	}
	e.noneInUse("ReadKeys")
}

// testLogicalCompleteStreamed: the rows found are removed (or stamped)
// and reported, those missing are not, and the snapshot's oldest running
// transaction comes with them.
func testLogicalCompleteStreamed(e *env) {
	lg := e.logical()
	id := e.insert(msgs("c", 4)...)
	found, xmin, err := lg.CompleteStreamed(e.ctx, e.db, []int64{id[0], id[1], id[3] + 1000}, false)
	e.check(err, "CompleteStreamed")
	slices.Sort(found)
	if !slices.Equal(found, id[:2]) || xmin == 0 {
		e.t.Fatalf("found %v, xmin %d; want %v and a transaction id", found, xmin, id[:2])
	}
	found, _, err = lg.CompleteStreamed(e.ctx, e.db, []int64{id[2]}, true)
	e.check(err, "CompleteStreamed keep")
	if !slices.Equal(found, id[2:3]) {
		e.t.Fatalf("kept: found %v", found)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); !slices.Equal(got, id[3:]) {
		e.t.Fatalf("pending after completing three: %v, want %v", got, id[3:])
	}
	found, _, err = lg.CompleteStreamed(e.ctx, e.db, []int64{id[2]}, true)
	e.check(err, "CompleteStreamed keep again")
	if len(found) != 0 {
		e.t.Fatalf("a row stamped before was found again: %v", found)
	}
	e.noneInUse("CompleteStreamed")
}

// testLogicalEmit writes records of the outbox without a table in
// transactions: those of a transaction that rolls back are nowhere in the
// stream, those of one that commits are, as transactional messages whose
// prefix names the outbox by its oid, with the ids of their messages
// appended, drawn from the outbox's sequence in order. A slot of its own
// reads them.
func testLogicalEmit(e *env) {
	lg := e.logical()
	st, err := lg.Check(e.ctx, e.db, "none", "none")
	e.check(err, "Check")
	if st.WalLevel != "logical" || st.ServerVersion < 140000 {
		e.t.Skipf("wal_level %q, server %d: the outbox without a table needs logical and 14 or later", st.WalLevel, st.ServerVersion)
	}
	name := slotName()
	e.t.Cleanup(func() { _ = lg.Drop(context.Background(), e.db, name, name) })
	e.check(lg.CreatePublication(e.ctx, e.db, name), "CreatePublication")
	e.check(lg.CreateSlot(e.ctx, e.db, name, false), "CreateSlot")
	emit := func(commit bool, records ...sqladapters.EmitRecord) {
		e.t.Helper()
		tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
		e.check(err, "begin")
		if err := lg.Emit(e.ctx, tx, records); err != nil {
			sqladapters.Rollback(tx)
			e.t.Fatalf("Emit: %v", err)
		}
		if commit {
			e.check(tx.Commit(e.ctx), "commit")
		} else {
			e.check(tx.Rollback(e.ctx), "rollback")
		}
	}
	emit(false, sqladapters.EmitRecord{Content: []byte("rolled back"), Messages: 1})
	emit(true, sqladapters.EmitRecord{Content: []byte("first"), Messages: 2}, sqladapters.EmitRecord{Content: []byte("second"), Messages: 1})
	e.check(lg.Emit(e.ctx, e.db, nil), "Emit of nothing")

	rows, err := e.db.Query(e.ctx, `SELECT data FROM pg_logical_slot_peek_binary_changes($1::name, NULL, NULL,
	'proto_version', '1', 'publication_names', $2::text, 'messages', 'true')`, name, name)
	e.check(err, "peek changes")
	var msgs []*pglogrepl.LogicalDecodingMessage
	for rows.Next() {
		var data []byte
		e.check(rows.Scan(&data), "scan change")
		m, err := pglogrepl.Parse(data)
		e.check(err, "parse change")
		if lm, ok := m.(*pglogrepl.LogicalDecodingMessage); ok {
			lm.Content = slices.Clone(lm.Content)
			msgs = append(msgs, lm)
		}
	}
	rows.Close()
	e.check(rows.Err(), "peek changes")
	prefix := fmt.Sprintf("%s%d", sqladapters.EmitPrefix, st.TableOID)
	id := func(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }
	// Each call also emits its number, drawn from the count of calls
	// without a table, in a message of its own prefix: a forwarder that
	// saw the count move knows such a call may be unread.
	// The slot decodes the whole database, where other tests may emit
	// messages of their own outboxes meanwhile: only this outbox's count.
	var counts []int64
	msgs = slices.DeleteFunc(msgs, func(m *pglogrepl.LogicalDecodingMessage) bool {
		if m.Prefix != prefix+sqladapters.EmitCountSuffix {
			return m.Prefix != prefix // another outbox's
		}
		if !m.Transactional || len(m.Content) != 8 {
			e.t.Fatalf("count message %+v, want a transactional one of 8 bytes", m)
		}
		counts = append(counts, id(m.Content))
		return true
	})
	slices.Sort(counts)
	if !slices.Equal(counts, []int64{2, 3}) {
		e.t.Fatalf("numbers of the calls in the stream %v, want 2 and 3 (the rolled back call drew 1)", counts)
	}
	if len(msgs) != 2 || !msgs[0].Transactional || msgs[0].Prefix != prefix || msgs[1].Prefix != prefix {
		var got []string
		for _, m := range msgs {
			got = append(got, fmt.Sprintf("%s %q", m.Prefix, m.Content))
		}
		e.t.Fatalf("messages in the stream %q, want the two committed ones with prefix %s", got, prefix)
	}
	first, second := msgs[0].Content, msgs[1].Content
	if string(first[:5]) != "first" || len(first) != 5+16 || string(second[:6]) != "second" || len(second) != 6+8 {
		e.t.Fatalf("contents %q and %q, want the records with 2 and 1 ids appended", first, second)
	}
	// The rolled back call drew an id too: sequences do not roll back.
	if a, b, c := id(first[5:]), id(first[13:]), id(second[6:]); a != 2 || b != 3 || c != 4 {
		e.t.Fatalf("ids %d %d %d, want 2 3 4 from the outbox's sequence", a, b, c)
	}
	e.noneInUse("Emit")
}

// testLogicalWriteMessages writes messages of the outbox without a table
// into the tables, under their ids, in one transaction: pending and failed
// ones into the outbox, a dead one into the dead letters, a forwarded one
// into the kept rows. Written again (a stream read again), they stay as
// they are.
func testLogicalWriteMessages(e *env) {
	lg := e.logical()
	created := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	w := func(id int64, uuid, key string, f *sqladapters.Failure, kept bool) sqladapters.WrittenMessage {
		return sqladapters.WrittenMessage{OutboxMessage: msg(uuid, key, 3), ID: id, Created: created, Failure: f, Kept: kept}
	}
	ms := []sqladapters.WrittenMessage{
		w(10, "failed", "k", &sqladapters.Failure{Attempts: 1, Error: "timeout", Backoff: time.Hour}, false),
		w(11, "pending", "k", nil, false),
		w(12, "dead", "d", &sqladapters.Failure{Attempts: 3, Error: "refused", Dead: true}, false),
		w(13, "kept", "", nil, true),
		w(14, "free", "", nil, false),
	}
	xid, err := lg.WriteMessages(e.ctx, e.db, ms)
	e.check(err, "WriteMessages")
	if xid == 0 {
		e.t.Fatal("no transaction id")
	}
	check := func(when string) {
		e.t.Helper()
		// The failed row backs off and holds its key's later row back.
		rows := e.pending(sqladapters.PendingQuery{Limit: 10})
		if len(rows) != 1 || rows[0].ID != 14 || rows[0].UUID != "free" || string(rows[0].Payload) != "payload of free" {
			e.t.Fatalf("%s: pending %+v, want only the free row", when, rows)
		}
		if rows[0].Age < 50*time.Minute {
			e.t.Fatalf("%s: the written row is %v old, want its creation kept", when, rows[0].Age)
		}
		dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10})
		if len(dls) != 1 || dls[0].ID != 12 || dls[0].Attempts != 3 || dls[0].LastError != "refused" || dls[0].Fingerprint != sqladapters.FingerprintError("refused") {
			e.t.Fatalf("%s: dead letters %+v", when, dls)
		}
		if got, err := e.d.ForwardedIDsBefore(e.ctx, e.db, time.Now().Add(time.Minute), 0, 10); err != nil || !slices.Equal(got, []int64{13}) {
			e.t.Fatalf("%s: kept rows %v, %v; want 13", when, got, err)
		}
		_, keys, err := lg.ReadKeys(e.ctx, e.db, []string{"k"}, false, 10, false)
		e.check(err, "ReadKeys")
		if len(keys) != 2 || keys[0].ID != 10 || keys[0].Due || keys[0].Attempts != 1 || keys[1].ID != 11 {
			e.t.Fatalf("%s: rows of key k %+v", when, keys)
		}
	}
	check("written")
	// Read again from the stream, as after a crash: a dead letter is not
	// brought back, a row in the outbox keeps its failure.
	again := slices.Clone(ms)
	for i := range again {
		again[i].Failure, again[i].Kept = nil, false
	}
	_, err = lg.WriteMessages(e.ctx, e.db, again[:3])
	e.check(err, "WriteMessages again")
	check("written again")
	if _, err := lg.WriteMessages(e.ctx, e.db, nil); err != nil {
		e.t.Fatalf("writing nothing: %v", err)
	}
	e.noneInUse("WriteMessages")
}
