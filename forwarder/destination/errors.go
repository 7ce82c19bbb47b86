package destination

import (
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters/startstop"
)

var (
	// ErrClosed is returned by a closed destination (and by a closed
	// forwarder or publisher: they are the same error).
	ErrClosed = startstop.ErrClosed
	// ErrInvalidConfig is returned by a destination's constructor for a
	// bad config (and by every millbox constructor: the same error).
	ErrInvalidConfig = startstop.ErrInvalidConfig
)

// ErrDestinationUnavailable marks a destination failure that is not about
// the messages: the broker is unreachable, the connection to it was lost,
// or it did not answer in time. Every message would fail the same way until
// the broker is back, so a caller pauses all publishing behind one probe
// instead of failing (and backing off) every key on its own.
//
// Destination publishers wrap it: errors.Is(err, ErrDestinationUnavailable).
var ErrDestinationUnavailable = errors.New("millbox: destination unavailable")

// DestinationUnavailable marks err as a failure of the destination rather
// than of the messages: the result reads as err does, and errors.Is(result,
// ErrDestinationUnavailable) holds, as does errors.Is and errors.As for
// what err wraps. It returns nil for nil.
func DestinationUnavailable(err error) error {
	if err == nil {
		return nil
	}
	return unavailableError{err}
}

type unavailableError struct{ err error }

func (e unavailableError) Error() string   { return e.err.Error() }
func (e unavailableError) Unwrap() []error { return []error{ErrDestinationUnavailable, e.err} }

// PartialError is returned by a batch publisher whose Publish call
// delivered the first Delivered messages, in call order, and not the rest.
//
// The contract between a destination publisher and the forwarder:
//   - nil: every message of the call was delivered;
//   - a *PartialError (possibly wrapped): messages [0, Delivered) were
//     delivered and acknowledged by the broker, in order; message
//     Delivered failed, and no later message of the call was delivered
//     ahead of it unless Err says otherwise. The forwarder counts the
//     prefix as done and publishes again from message Delivered;
//   - any other error: no message is known to be delivered, and the
//     forwarder publishes again from the first message.
//
// Publishing again may duplicate messages the broker took without
// acknowledging them (at least once); it never reorders a key, because a
// batch publisher writes no later message of a call after an earlier one
// failed. Err tells why message Delivered failed; when it wraps
// ErrDestinationUnavailable the failure is about the broker, not the
// message.
type PartialError struct {
	// Delivered is the number of leading messages of the call that were
	// delivered, 0 <= Delivered < len(msgs).
	Delivered int
	// Err is the failure of message Delivered.
	Err error
}

// Error says how many messages were delivered and why the next one failed.
func (e *PartialError) Error() string {
	return fmt.Sprintf("first %d delivered, then: %v", e.Delivered, e.Err)
}

// Unwrap returns Err, so errors.Is sees ErrDestinationUnavailable through
// a PartialError.
func (e *PartialError) Unwrap() error { return e.Err }

// DeliveredPrefix returns how many leading messages of a Publish call err
// reports as delivered: PartialError.Delivered when err is or wraps a
// *PartialError, 0 for any other error, and n (all of them) for nil.
func DeliveredPrefix(err error, n int) int {
	if err == nil {
		return n
	}
	var pe *PartialError
	if errors.As(err, &pe) && pe.Delivered > 0 && pe.Delivered < n {
		return pe.Delivered
	}
	return 0
}

// ErrInvalidMessage marks a message that cannot be stored or published as
// it is. The outbox publisher returns it for a message it refuses (the
// error names the field and the limit or the value); a destination wraps
// it for a message its broker refuses, which the forwarder's metrics
// count as error.type invalid_message.
var ErrInvalidMessage = errors.New("millbox: invalid message")
