package pgoutput

import (
	"encoding/binary"
	"testing"

	"github.com/jackc/pglogrepl"
)

func tuple(cols ...*pglogrepl.TupleDataColumn) *pglogrepl.TupleData {
	return &pglogrepl.TupleData{ColumnNum: uint16(len(cols)), Columns: cols}
}

func text(s string) *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Length: uint32(len(s)), Data: []byte(s)}
}

func null() *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull}
}

// outboxRelation is the relation message of the outbox's columns.
func outboxRelation(t *testing.T) *relation {
	r := NewDecoder(16384, "")
	var cols []*pglogrepl.RelationMessageColumn
	for _, n := range []string{"id", "topic", "uuid", "payload", "metadata", "key", "key_hash", "created_at", "attempts", "last_error", "next_attempt_at", "dead_at", "published_at", "error_fp", "requeued_at"} {
		cols = append(cols, &pglogrepl.RelationMessageColumn{Name: n})
	}
	if other := r.relation(&pglogrepl.RelationMessage{RelationID: 16385, RelationName: "millbox_outbox", Columns: cols}); other.ours {
		t.Fatal("a table of the same name under another oid is taken for the outbox")
	}
	rel := r.relation(&pglogrepl.RelationMessage{RelationID: 16384, RelationName: "millbox_outbox", Columns: cols})
	if !rel.ours {
		t.Fatal("the outbox relation is not recognized")
	}
	return rel
}

func TestDecodeRow(t *testing.T) {
	rel := outboxRelation(t)
	row, err := decodeRow(rel, tuple(text("42"), text("orders"), text("u-1"), text(`\x00ff41`), text(`{"a": "b"}`),
		text("k1"), text("7"), text("2026-01-01"), text("0"), null(), text("2026-01-01"), null(), null()))
	if err != nil {
		t.Fatal(err)
	}
	if row.ID != 42 || row.Topic != "orders" || row.UUID != "u-1" || string(row.Payload) != "\x00\xffA" ||
		string(row.Metadata) != `{"a": "b"}` || row.Key != "k1" || !row.Keyed {
		t.Fatalf("row = %+v", row)
	}
	row, err = decodeRow(rel, tuple(text("43"), text("t"), text("u-2"), text(`\x`), text(`{}`),
		null(), text("7"), text("x"), text("0"), null(), text("x"), null(), null()))
	if err != nil || row.Keyed || len(row.Payload) != 0 {
		t.Fatalf("unkeyed row = %+v, %v", row, err)
	}
	if _, err := decodeRow(rel, tuple(text("44"), text("t"), text("u"), text(`zz`))); err == nil {
		t.Fatal("a payload that is not hex bytea was accepted")
	}
}

func TestDecodeRequeue(t *testing.T) {
	rel := outboxRelation(t)
	insert := func(key, attempts, requeued *pglogrepl.TupleDataColumn) *pglogrepl.TupleData {
		return tuple(text("9"), text("t"), text("u"), text(`\x41`), text("{}"), key, text("1"), text("x"), attempts, text("err"), text("x"),
			null(), null(), text(`\x00`), requeued)
	}
	row, err := decodeRow(rel, insert(text("k"), text("0"), text("2026-01-01")))
	if err != nil || !row.Requeued || row.ID != 9 || row.Key != "k" || !row.Keyed {
		t.Fatalf("requeued row = %+v, %v", row, err)
	}
	row, err = decodeRow(rel, insert(text("k"), text("0"), null()))
	if err != nil || row.Requeued {
		t.Fatalf("a new row taken for a requeue: %+v, %v", row, err)
	}
}

func bin(b ...byte) *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeBinary, Length: uint32(len(b)), Data: b}
}

func TestDecodeRowBinary(t *testing.T) {
	rel := outboxRelation(t)
	row, err := decodeRow(rel, tuple(bin(0, 0, 0, 0, 0, 0, 1, 0), bin([]byte("orders")...), bin([]byte("u-1")...),
		bin(0, 0xff, 'A'), bin(append([]byte{1}, `{"a": "b"}`...)...), bin([]byte("k1")...), bin(0, 0, 0, 7),
		bin(0), bin(0, 0, 0, 2), null(), bin(0), null(), null()))
	if err != nil {
		t.Fatal(err)
	}
	if row.ID != 256 || row.Topic != "orders" || row.UUID != "u-1" || string(row.Payload) != "\x00\xffA" ||
		string(row.Metadata) != `{"a": "b"}` || row.Key != "k1" || !row.Keyed || row.Attempts != 2 {
		t.Fatalf("row = %+v", row)
	}
}

// wire encodes pgoutput messages of one transaction: its begin, logical
// decoding messages of the given prefixes and contents, its commit.
func wire(xid uint32, msgs ...[2][]byte) [][]byte {
	be := binary.BigEndian
	begin := append([]byte{'B'}, make([]byte, 20)...)
	be.PutUint32(begin[17:], xid)
	out := [][]byte{begin}
	for _, m := range msgs {
		b := []byte{'M', 1}
		b = append(b, make([]byte, 8)...)
		b = append(append(b, m[0]...), 0)
		b = be.AppendUint32(b, uint32(len(m[1])))
		out = append(out, append(b, m[1]...))
	}
	commit := append([]byte{'C', 0}, make([]byte, 24)...)
	be.PutUint64(commit[10:], 77)
	return append(out, commit)
}

func TestDecodeEmitCount(t *testing.T) {
	d := NewDecoder(16384, "millbox:16384")
	num := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	var ev *Event
	for _, data := range wire(7,
		[2][]byte{[]byte("millbox:16384_n"), num(5)},
		[2][]byte{[]byte("millbox:99_n"), num(40)}, // another outbox's count
		[2][]byte{[]byte("millbox:16384_n"), num(3)},
		[2][]byte{[]byte("millbox:16384_n"), []byte("short")},
	) {
		e, err := d.Message(data)
		if err != nil {
			t.Fatal(err)
		}
		if e != nil {
			ev = e
		}
	}
	if ev == nil || ev.XID != 7 || ev.End != 77 {
		t.Fatalf("transaction = %+v", ev)
	}
	if ev.Emits != 5 || ev.Emitted || len(ev.Rows) != 0 {
		t.Fatalf("emits = %d, emitted %v, %d rows; want the outbox's highest number 5 and no rows", ev.Emits, ev.Emitted, len(ev.Rows))
	}
}
