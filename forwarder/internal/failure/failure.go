package failure

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"unicode/utf8"

	"github.com/millbox/millbox/forwarder/destination"
)

// permanent marks a row that can never be published as stored; it is
// dead-lettered at once.
type permanent struct{ err error }

func (e permanent) Error() string { return e.err.Error() }
func (e permanent) Unwrap() error { return e.err }

// Permanent marks err as one that no retry can fix.
func Permanent(err error) error { return permanent{err} }

// IsPermanent tells whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// unavailableMarkers are texts of connection-level errors of publishers
// that do not wrap ErrDestinationUnavailable or a network error: sarama
// (watermill-kafka), amqp091 (watermill-amqp), franz-go, nats.go
// (watermill-nats), go-redis (watermill-redisstream).
var unavailableMarkers = []string{
	"connection refused",
	"connection reset",
	"broken pipe",
	"not connected",
	"connection closed",
	"connection is not open",
	"run out of available brokers",
	"circuit breaker is open", // sarama's own breaker, for a while after its broker came back
	"no route to host",
	"unable to dial",
	"use of closed network connection",
	// nats.go: no acknowledgement from JetStream in time (the server is
	// down or restarting; the client reconnects meanwhile), or the
	// connection is down.
	"nats: timeout",
	"nats: connection reconnecting",
	"nats: server is disconnected",
	"nats: no servers available",
	"nats: outbound buffer limit exceeded",
	"nats: stale connection",
	"jetstream not enabled",
	"jetstream system temporarily unavailable",
	// Redis: restarting, failing over, full (noeviction), or too busy.
	"redis is loading the dataset",
	"masterdown",
	"clusterdown",
	"tryagain",
	"read only replica",
	"oom command not allowed",
	"max number of clients reached",
	"connection pool timeout",
}

// Unavailable tells a failure of the destination as a whole (broker down,
// connection lost) from a failure about the message.
func Unavailable(err error) bool {
	if err == nil || IsPermanent(err) {
		return false
	}
	if errors.Is(err, destination.ErrDestinationUnavailable) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	s := strings.ToLower(err.Error())
	for _, m := range unavailableMarkers {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// MaxErrorLength bounds the error text stored with a failed row.
const MaxErrorLength = 2000

// Text makes err storable as text in every database: valid UTF-8, no NUL
// bytes, at most MaxErrorLength bytes.
func Text(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > MaxErrorLength {
		s = s[:MaxErrorLength]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
