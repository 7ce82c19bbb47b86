package cdc

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/postgres"
)

type nopDB struct{ sqladapters.DB }

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

func validConfig() Config {
	return Config{
		ConnString: "postgres://127.0.0.1/test",
		DB:         nopDB{},
		Dialect:    postgres.MustNew(postgres.Options{}),
		Publisher:  nopPublisher{},
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"no conn string", func(c *Config) { c.ConnString = "" }, "ConnString"},
		{"no db", func(c *Config) { c.DB = nil }, "Config.DB"},
		{"no dialect", func(c *Config) { c.Dialect = nil }, "Config.Dialect"},
		{"mysql", func(c *Config) { c.Dialect = mysql.MustNew(mysql.Options{}) }, "postgres"},
		{"no publisher", func(c *Config) { c.Publisher = nil }, "Config.Publisher"},
		{"slot injection", func(c *Config) { c.Slot = "x'; DROP TABLE t; --" }, "Config.Slot"},
		{"slot upper case", func(c *Config) { c.Slot = "Slot" }, "Config.Slot"},
		{"slot too long", func(c *Config) { c.Slot = strings.Repeat("s", 64) }, "Config.Slot"},
		{"publication quote", func(c *Config) { c.Publication = `p"x` }, "Config.Publication"},
		{"publication space", func(c *Config) { c.Publication = "p x" }, "Config.Publication"},
		{"concurrency", func(c *Config) { c.Concurrency = -1 }, "Concurrency"},
		{"publish batch", func(c *Config) { c.PublishBatch = 10001 }, "PublishBatch"},
		{"status interval", func(c *Config) { c.StatusInterval = time.Minute }, "StatusInterval"},
		{"backoff", func(c *Config) { c.MinBackoff, c.MaxBackoff = 2*time.Second, time.Second }, "MinBackoff"},
		{"delete batch", func(c *Config) { c.DeleteBatch = -1 }, "DeleteBatch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := validConfig()
			tc.edit(&cfg)
			_, err := New(cfg)
			if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sqladapters.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to name %s", err, tc.want)
			}
		})
	}
	if _, err := New(validConfig()); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	f, err := New(validConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := f.cfg
	if c.Slot != DefaultSlot || c.Publication != DefaultPublication || c.Concurrency != DefaultConcurrency ||
		c.PublishBatch != DefaultPublishBatch || c.MaxAttempts != DefaultMaxAttempts || c.DeleteBatch != DefaultDeleteBatch {
		t.Fatalf("defaults not applied: %+v", c)
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

func TestTextArrayQuotes(t *testing.T) {
	got := textArray([]string{`a`, `b"c`, `d\e`, `{x,y}`, ``})
	want := `{"a","b\"c","d\\e","{x,y}",""}`
	if got != want {
		t.Fatalf("textArray = %s, want %s", got, want)
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

func toast() *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeToast}
}

// outboxRelation is the relation message of the outbox's columns.
func outboxRelation(t *testing.T) *relation {
	r := &reader{table: names{table: "millbox_outbox"}}
	var cols []*pglogrepl.RelationMessageColumn
	for _, n := range []string{"id", "topic", "uuid", "payload", "metadata", "key", "key_hash", "created_at", "attempts", "last_error", "next_attempt_at", "dead_at", "published_at"} {
		cols = append(cols, &pglogrepl.RelationMessageColumn{Name: n})
	}
	rel := r.relation(&pglogrepl.RelationMessage{RelationName: "millbox_outbox", Columns: cols})
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
	upd := func(key *pglogrepl.TupleDataColumn, attempts string, dead, pub *pglogrepl.TupleDataColumn) *pglogrepl.TupleData {
		return tuple(text("9"), text("t"), text("u"), toast(), text("{}"), key, text("1"), text("x"), text(attempts), text("err"), text("x"), dead, pub)
	}
	if rq, ok := decodeRequeue(rel, upd(text("k"), "0", null(), null())); !ok || rq.id != 9 || rq.key != "k" || !rq.keyed {
		t.Fatalf("requeue = %+v, %v", rq, ok)
	}
	if rq, ok := decodeRequeue(rel, upd(toast(), "0", null(), null())); !ok || !rq.keyUnknown {
		t.Fatalf("requeue with a TOASTed key = %+v, %v", rq, ok)
	}
	for name, tup := range map[string]*pglogrepl.TupleData{
		"failure record": upd(text("k"), "3", null(), null()),
		"dead letter":    upd(text("k"), "0", text("now"), null()),
		"published":      upd(text("k"), "0", null(), text("now")),
	} {
		if _, ok := decodeRequeue(rel, tup); ok {
			t.Errorf("%s taken for a requeue", name)
		}
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
