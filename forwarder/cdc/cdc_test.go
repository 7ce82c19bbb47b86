package cdc

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func validSource() Source {
	return Source{ConnString: "postgres://127.0.0.1/test"}
}

func TestSourceRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Source)
		want string
	}{
		{"no conn string", func(c *Source) { c.ConnString = "" }, "ConnString"},
		{"slot injection", func(c *Source) { c.Slot = "x'; DROP TABLE t; --" }, "Source.Slot"},
		{"slot upper case", func(c *Source) { c.Slot = "Slot" }, "Source.Slot"},
		{"slot too long", func(c *Source) { c.Slot = strings.Repeat("s", 64) }, "Source.Slot"},
		{"publication quote", func(c *Source) { c.Publication = `p"x` }, "Source.Publication"},
		{"publication space", func(c *Source) { c.Publication = "p x" }, "Source.Publication"},
		{"status interval", func(c *Source) { c.StatusInterval = time.Minute }, "StatusInterval"},
		{"standby retry", func(c *Source) { c.StandbyRetry = time.Millisecond }, "StandbyRetry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := validSource()
			tc.edit(&src)
			err := src.Validate()
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sqladapters.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %s", err, tc.want)
			}
		})
	}
	if err := validSource().Validate(); err != nil {
		t.Fatalf("valid source: %v", err)
	}
	// A database that cannot stream its changes is refused by name.
	_, err := validSource().Open(source.Env{Dialect: mysql.MustNew(mysql.Options{})})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "mysql") {
		t.Fatalf("mysql dialect: %v", err)
	}
	if _, err := validSource().Open(source.Env{Dialect: postgres.MustNew(postgres.Options{})}); err != nil {
		t.Fatalf("postgres dialect: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	src := Source{}
	src.setDefaults()
	if src.Slot != DefaultSlot || src.Publication != DefaultPublication || src.StandbyRetry != DefaultStandbyRetry ||
		src.StatusInterval != DefaultStatusInterval {
		t.Fatalf("defaults not applied: %+v", src)
	}
}

func TestPrecedesWraps(t *testing.T) {
	for _, tc := range []struct {
		a, b uint32
		want bool
	}{
		{3, 4, true}, {4, 3, false}, {5, 5, false},
		{0xFFFFFFF0, 10, true}, // 10 came after the wraparound
		{10, 0xFFFFFFF0, false},
	} {
		if got := precedes(tc.a, tc.b); got != tc.want {
			t.Errorf("precedes(%d, %d) = %v", tc.a, tc.b, got)
		}
	}
}

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
	r := &reader{oid: 16384}
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
		string(row.Metadata) != `{"a": "b"}` || row.Key != "k1" || !row.keyed {
		t.Fatalf("row = %+v", row)
	}
	row, err = decodeRow(rel, tuple(text("43"), text("t"), text("u-2"), text(`\x`), text(`{}`),
		null(), text("7"), text("x"), text("0"), null(), text("x"), null(), null()))
	if err != nil || row.keyed || len(row.Payload) != 0 {
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
	if err != nil || !row.requeued || row.ID != 9 || row.Key != "k" || !row.keyed {
		t.Fatalf("requeued row = %+v, %v", row, err)
	}
	row, err = decodeRow(rel, insert(text("k"), text("0"), null()))
	if err != nil || row.requeued {
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
		string(row.Metadata) != `{"a": "b"}` || row.Key != "k1" || !row.keyed || row.Attempts != 2 {
		t.Fatalf("row = %+v", row)
	}
}

func TestSlotLostErrorNamesTheLostRange(t *testing.T) {
	err := error(&SlotLostError{Slot: "s", From: 0x3000100, To: 0x3000900, PreviousTimeline: 1, Timeline: 2})
	if !errors.Is(err, ErrSlotLost) {
		t.Fatal("errors.Is(err, ErrSlotLost) is false")
	}
	var sl *SlotLostError
	if !errors.As(err, &sl) || sl.Bytes() != 0x800 {
		t.Fatalf("Bytes = %d, want 2048", sl.Bytes())
	}
	for _, want := range []string{"0/3000100", "0/3000900", "2048 bytes", "timeline 2, was 1"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	if (&SlotLostError{From: 9, To: 3}).Bytes() != 0 {
		t.Error("a slot that starts before the confirmed position lost bytes")
	}
}
