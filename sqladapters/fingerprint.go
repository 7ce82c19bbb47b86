package sqladapters

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
)

// ErrorFingerprint identifies the text of a dead letter's last error: the
// first 16 bytes of the text's SHA-256. The outbox stores it with every
// failure and the dead letters' table indexes it, so that the dead letters of one
// error are found through that index and addressed by this short value,
// never by the text itself, which may be megabytes long and hold anything.
//
// The zero fingerprint stands for rows recorded without one: dead before
// the migration that added fingerprints to the outbox, or by a process
// built before it.
type ErrorFingerprint [16]byte

// ErrBadFingerprint is returned by ParseErrorFingerprint.
var ErrBadFingerprint = errors.New("millbox: not an error fingerprint (32 hexadecimal digits)")

// FingerprintError returns the fingerprint of an error text as stored.
func FingerprintError(text string) ErrorFingerprint {
	sum := sha256.Sum256([]byte(text))
	var f ErrorFingerprint
	copy(f[:], sum[:])
	return f
}

// ParseErrorFingerprint reads the form String writes: 32 hexadecimal
// digits.
func ParseErrorFingerprint(s string) (ErrorFingerprint, error) {
	var f ErrorFingerprint
	if len(s) != 2*len(f) {
		return f, fmt.Errorf("%w: %d characters", ErrBadFingerprint, len(s))
	}
	if _, err := hex.Decode(f[:], []byte(s)); err != nil {
		return ErrorFingerprint{}, ErrBadFingerprint
	}
	return f, nil
}

// String returns the fingerprint as 32 lower-case hexadecimal digits.
func (f ErrorFingerprint) String() string { return hex.EncodeToString(f[:]) }

// IsZero reports whether f stands for rows recorded without a fingerprint.
func (f ErrorFingerprint) IsZero() bool { return f == ErrorFingerprint{} }
