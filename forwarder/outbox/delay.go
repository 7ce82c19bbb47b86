package outbox

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

const (
	// DelayedUntilMetadataField holds the time before which a message must
	// not be forwarded, in RFC 3339 (fractions of a second allowed). It is
	// the field Watermill's delay.Message sets.
	DelayedUntilMetadataField = delay.DelayedUntilKey
	// DelayedForMetadataField holds how long after its publication a
	// message must wait, as a Go duration ("90s", "1h30m"). It counts only
	// when DelayedUntilMetadataField is absent.
	DelayedForMetadataField = delay.DelayedForKey
)

// DeliverAt makes msg due at t: the outbox publisher stores it until then
// and the forwarder sends it no earlier (see the forwarder package doc, "Delayed
// messages"). It sets the metadata of Watermill's delay.Message, with t to
// the nanosecond. A time that has passed publishes the message at once.
func DeliverAt(msg *message.Message, t time.Time) {
	if msg.Metadata == nil {
		msg.Metadata = make(message.Metadata)
	}
	msg.Metadata.Set(DelayedUntilMetadataField, t.UTC().Format(time.RFC3339Nano))
	msg.Metadata.Set(DelayedForMetadataField, time.Until(t).String())
}

// DeliverAfter makes msg due d from now (DeliverAt).
func DeliverAfter(msg *message.Message, d time.Duration) {
	DeliverAt(msg, time.Now().Add(d))
}

// dueAt reads the due time of m from its delay metadata: zero when it has
// none or when the time is not after now, so that the message goes at
// once.
func dueAt(m *message.Message, now time.Time) (time.Time, error) {
	// An empty field is no delay, as Watermill's delay publisher reads it.
	until, forText := m.Metadata.Get(DelayedUntilMetadataField), m.Metadata.Get(DelayedForMetadataField)
	hasUntil, hasFor := until != "", forText != ""
	var due time.Time
	if hasUntil {
		t, err := time.Parse(time.RFC3339, until)
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: message %s: metadata %s %s is not an RFC 3339 time (such as %s)",
				ErrInvalidMessage, m.UUID, DelayedUntilMetadataField, quoteShort(until), now.UTC().Format(time.RFC3339))
		}
		due = t
	}
	if hasFor {
		d, err := time.ParseDuration(forText)
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: message %s: metadata %s %s is not a duration (such as 90s or 1h30m)",
				ErrInvalidMessage, m.UUID, DelayedForMetadataField, quoteShort(forText))
		}
		if !hasUntil {
			due = now.Add(d)
		}
	}
	if !due.After(now) {
		return time.Time{}, nil
	}
	return due, nil
}

// quoteShort quotes s for an error message, cut to its first 64 bytes.
func quoteShort(s string) string {
	const limit = 64
	if len(s) <= limit {
		return fmt.Sprintf("%q", s)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q (%d bytes)", s[:cut]+"…", len(s))
}
