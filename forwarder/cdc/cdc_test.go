package cdc

import (
	"errors"
	"strings"
	"testing"
	"time"

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
