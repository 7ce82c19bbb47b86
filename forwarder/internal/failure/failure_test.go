package failure

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTextIsStorable(t *testing.T) {
	s := Text(errors.New("bad \xff\xfe bytes \x00 and " + strings.Repeat("é", 3000)))
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || len(s) > MaxErrorLength {
		t.Fatalf("not storable: valid=%v len=%d", utf8.ValidString(s), len(s))
	}
}

func TestPermanentIsNeverAnOutage(t *testing.T) {
	err := Permanent(errors.New("connection refused in the payload"))
	if !IsPermanent(err) || Unavailable(err) {
		t.Fatalf("permanent %v, unavailable %v", IsPermanent(err), Unavailable(err))
	}
}

// The connection-level errors of the NATS and Redis clients, as Watermill's
// publishers return them, are outages; their errors about a message are
// not.
func TestNATSAndRedisOutagesAreUnavailable(t *testing.T) {
	for _, text := range []string{
		"sending message failed: nats: timeout",
		"nats: timeout waiting for ack",
		"nats: connection reconnecting",
		"nats: connection closed",
		"nats: server is disconnected",
		"nats: outbound buffer limit exceeded",
		"nats: API error: code=503 err_code=10039 description=jetstream not enabled for account",
		"cannot xadd message 1: LOADING Redis is loading the dataset in memory",
		"cannot xadd message 1: OOM command not allowed when used memory > 'maxmemory'.",
		"cannot xadd message 1: READONLY You can't write against a read only replica.",
		"cannot xadd message 1: redis: connection pool timeout",
	} {
		if !Unavailable(errors.New(text)) {
			t.Errorf("%q: not an outage", text)
		}
	}
	for _, text := range []string{
		"sending message failed: nats: maximum payload exceeded",
		"sending message failed: nats: no response from stream",
		"cannot xadd message 1: WRONGTYPE Operation against a key holding the wrong kind of value",
		"cannot marshal message 1: metadata _watermill_message_uuid is reserved by watermill for message UUID",
	} {
		if Unavailable(errors.New(text)) {
			t.Errorf("%q: taken for an outage, but it is about the message", text)
		}
	}
}
