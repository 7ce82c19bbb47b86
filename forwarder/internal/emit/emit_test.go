package emit

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters"
)

func TestRoundTrip(t *testing.T) {
	msgs := []sqladapters.OutboxMessage{
		{Topic: "orders", UUID: "u1", Payload: []byte{0, 1, 0xff}, Metadata: []byte(`{"partition_key":"k","traceparent":"00-x"}`), Key: "k", KeyHash: 2147483647},
		{Topic: "orders", UUID: "u2", Payload: []byte{}, Metadata: []byte(`{}`), KeyHash: 0},
		{Topic: "orders", UUID: "ключ", Payload: bytes.Repeat([]byte("p"), 70000), Metadata: []byte(`{}`), Key: "", KeyHash: 5},
	}
	b := Encode(msgs)
	if b[0] != Version {
		t.Fatalf("version byte %d", b[0])
	}
	ids := []int64{7, 8, 1 << 40}
	for _, id := range ids {
		b = binary.BigEndian.AppendUint64(b, uint64(id))
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("%d messages back, want %d", len(got), len(msgs))
	}
	for i, m := range msgs {
		g := got[i]
		if g.ID != ids[i] || g.Topic != m.Topic || g.UUID != m.UUID || g.Key != m.Key || g.KeyHash != m.KeyHash ||
			!bytes.Equal(g.Payload, m.Payload) || !bytes.Equal(g.Metadata, m.Metadata) {
			t.Fatalf("message %d back as %+v, want %+v", i, g, m)
		}
	}
	// The topic is written once, whatever the number of messages.
	if n := strings.Count(string(b), "orders"); n != 1 {
		t.Fatalf("the topic appears %d times", n)
	}
}

func TestDecodeRefuses(t *testing.T) {
	good := binary.BigEndian.AppendUint64(Encode([]sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte("p"), Metadata: []byte(`{}`), Key: "k", KeyHash: 1}}), 1)
	if _, err := Decode(good); err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(append([]byte{Version + 1}, good[1:]...)); !errors.Is(err, ErrVersion) {
		t.Fatalf("a newer version: %v, want ErrVersion", err)
	}
	for name, b := range map[string][]byte{
		"empty":      nil,
		"truncated":  good[:len(good)-1],
		"no ids":     good[:len(good)-8],
		"trailing":   append(append([]byte{}, good...), 0),
		"huge count": append([]byte{Version, 1, 't'}, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := Decode(b); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
}

func TestSplit(t *testing.T) {
	msg := func(n int) sqladapters.OutboxMessage {
		return sqladapters.OutboxMessage{Topic: "t", UUID: "u", Payload: make([]byte, n), Metadata: []byte(`{}`)}
	}
	msgs := []sqladapters.OutboxMessage{msg(100), msg(100), msg(1000), msg(100)}
	runs := Split(msgs, 400)
	if len(runs) != 3 || len(runs[0]) != 2 || len(runs[1]) != 1 || len(runs[2]) != 1 {
		t.Fatalf("runs of %v", func() (n []int) {
			for _, r := range runs {
				n = append(n, len(r))
			}
			return n
		}())
	}
	for _, r := range runs {
		if size := len(Encode(r)); len(r) > 1 && size > 400 {
			t.Fatalf("a run of %d messages encodes to %d bytes, over the budget", len(r), size)
		}
	}
	if runs := Split(msgs[:2], 1<<20); len(runs) != 1 {
		t.Fatalf("small messages make %d runs, want 1", len(runs))
	}
}
