package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The due time comes from Watermill's delay metadata and from DeliverAt
// and DeliverAfter; a time that has passed means now.
func TestDueAt(t *testing.T) {
	now := time.Now()
	at := now.Add(time.Hour).Truncate(time.Second)
	msg := func(md map[string]string) *message.Message {
		m := message.NewMessage("m", nil)
		for k, v := range md {
			m.Metadata.Set(k, v)
		}
		return m
	}
	watermillUntil := msg(nil)
	delay.Message(watermillUntil, delay.Until(at))
	watermillFor := msg(nil)
	delay.Message(watermillFor, delay.For(time.Hour))
	zero := msg(nil)
	delay.Message(zero, delay.Delay{})
	exact := msg(nil)
	DeliverAt(exact, at.Add(123456789*time.Nanosecond))
	after := msg(nil)
	DeliverAfter(after, time.Minute)
	past := msg(nil)
	DeliverAt(past, now.Add(-time.Second))

	for _, c := range []struct {
		name     string
		m        *message.Message
		from, to time.Time // the due time is within [from, to]; zero: none
	}{
		{"none", msg(nil), time.Time{}, time.Time{}},
		{"delay.Until", watermillUntil, at, at},
		{"delay.For", watermillFor, now.Add(time.Hour - time.Second), time.Now().Add(time.Hour)},
		{"zero delay", zero, time.Time{}, time.Time{}},
		{"DeliverAt", exact, at.Add(123456789 * time.Nanosecond), at.Add(123456789 * time.Nanosecond)},
		{"DeliverAfter", after, now.Add(time.Minute), time.Now().Add(time.Minute)},
		{"past", past, time.Time{}, time.Time{}},
		{"until wins over for", msg(map[string]string{DelayedUntilMetadataField: at.Format(time.RFC3339), DelayedForMetadataField: "5h"}), at, at},
		{"for alone", msg(map[string]string{DelayedForMetadataField: "90s"}), now.Add(90 * time.Second), now.Add(90 * time.Second)},
		{"negative for", msg(map[string]string{DelayedForMetadataField: "-90s"}), time.Time{}, time.Time{}},
		{"empty fields", msg(map[string]string{DelayedUntilMetadataField: "", DelayedForMetadataField: ""}), time.Time{}, time.Time{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := dueAt(c.m, now)
			if err != nil {
				t.Fatal(err)
			}
			if c.from.IsZero() {
				if !got.IsZero() {
					t.Fatalf("due %v, want at once", got)
				}
				return
			}
			if got.Before(c.from) || got.After(c.to) {
				t.Fatalf("due %v, want within [%v, %v]", got, c.from, c.to)
			}
		})
	}
}

// A delay that cannot be read is refused, naming the field and the value,
// shortened when long.
func TestDueAtRefusesBadValues(t *testing.T) {
	long := strings.Repeat("é", 100)
	for _, c := range []struct {
		field, value string
		want         []string
	}{
		{DelayedUntilMetadataField, "tomorrow", []string{DelayedUntilMetadataField, `"tomorrow"`, "RFC 3339"}},
		{DelayedUntilMetadataField, "2026-01-02 15:04:05", []string{DelayedUntilMetadataField, `"2026-01-02 15:04:05"`}},
		{DelayedForMetadataField, "10 minutes", []string{DelayedForMetadataField, `"10 minutes"`, "duration"}},
		{DelayedForMetadataField, long, []string{DelayedForMetadataField, "…", "(200 bytes)"}},
		{DelayedForMetadataField, "\x00\n", []string{DelayedForMetadataField, `"\x00\n"`}},
	} {
		m := message.NewMessage("m", nil)
		m.Metadata.Set(c.field, c.value)
		_, err := dueAt(m, time.Now())
		if !errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("%s=%q: %v, want ErrInvalidMessage", c.field, c.value, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%s=%q: error %q does not name %q", c.field, c.value, err, w)
			}
		}
		if len(err.Error()) > 300 {
			t.Fatalf("error of %d bytes: %s", len(err.Error()), err)
		}
	}
}

// The metadata fields are Watermill's.
func TestDelayFieldsAreWatermills(t *testing.T) {
	if DelayedUntilMetadataField != "_watermill_delayed_until" || DelayedForMetadataField != "_watermill_delayed_for" {
		t.Fatal(DelayedUntilMetadataField, DelayedForMetadataField)
	}
}
