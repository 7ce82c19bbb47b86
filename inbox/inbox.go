package inbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/millbox/millbox/sqladapters"
)

// MaxKeyBytes is the longest consumer name or message id Record accepts.
// Both go into one primary-key index entry, and Postgres refuses index
// entries larger than about 2.7 kB.
const MaxKeyBytes = 1024

var (
	// ErrInvalidConfig is returned by constructors for a bad config. The
	// error names the field and the rule.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
	// ErrInvalidKey is returned by Record for a consumer name or message id
	// the inbox cannot store faithfully: empty, longer than MaxKeyBytes,
	// not valid UTF-8, or containing a NUL byte.
	ErrInvalidKey = errors.New("millbox: invalid inbox key")
	// ErrNoTx is returned by Record without a transaction. The inbox never
	// records outside the transaction that does the work.
	ErrNoTx = sqladapters.ErrNoTx
)

// Config configures an Inbox.
type Config struct {
	// Dialect describes the database and the inbox table. Required.
	Dialect sqladapters.Dialect
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if c.Dialect == nil {
		return fmt.Errorf("%w: inbox.Config.Dialect is required (for example postgres.New(postgres.Options{}))", ErrInvalidConfig)
	}
	return nil
}

// Inbox records processed messages. It is safe for concurrent use.
type Inbox struct {
	d sqladapters.Dialect
}

// New validates cfg and returns an Inbox.
func New(cfg Config) (*Inbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Inbox{d: cfg.Dialect}, nil
}

// Record records in tx that consumer has processed messageID. It returns
// true the first time and false for a duplicate: a key another transaction
// already committed. When another transaction holds the key uncommitted,
// Record waits for it to end (see the package documentation).
//
// The record becomes visible when tx commits; if tx rolls back, the message
// counts as never processed. After a duplicate, roll tx back: the work has
// been done before.
//
// A missing inbox table fails with a *sqladapters.MissingTableError that
// says how to create it.
func (i *Inbox) Record(ctx context.Context, tx sqladapters.Tx, consumer, messageID string) (first bool, err error) {
	if tx == nil {
		return false, fmt.Errorf("millbox: inbox: record message %q: %w", messageID, ErrNoTx)
	}
	if err := ValidateKey("consumer", consumer); err != nil {
		return false, err
	}
	if err := ValidateKey("message id", messageID); err != nil {
		return false, err
	}
	n, err := i.d.InsertInbox(consumer, messageID).Exec(ctx, tx)
	if err != nil {
		err = i.d.ClassifyError(err)
		// A dialect may report the duplicate as a unique violation instead
		// of zero rows; either way the key was there.
		if errors.Is(err, sqladapters.ErrDuplicate) {
			return false, nil
		}
		return false, fmt.Errorf("millbox: inbox: record message %q for consumer %q: %w", messageID, consumer, err)
	}
	switch n {
	case 1:
		return true, nil
	case 0:
		return false, nil
	default:
		return false, fmt.Errorf("millbox: inbox: record message %q for consumer %q: insert affected %d rows, want 0 or 1", messageID, consumer, n)
	}
}

// ValidateKey checks a consumer name or message id the way Record does;
// field names it in the error, which wraps ErrInvalidKey.
func ValidateKey(field, value string) error {
	switch {
	case value == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidKey, field)
	case len(value) > MaxKeyBytes:
		return fmt.Errorf("%w: %s is %d bytes, longer than %d", ErrInvalidKey, field, len(value), MaxKeyBytes)
	case !utf8.ValidString(value):
		return fmt.Errorf("%w: %s %q is not valid UTF-8", ErrInvalidKey, field, value)
	case strings.IndexByte(value, 0) >= 0:
		return fmt.Errorf("%w: %s %q contains a NUL byte", ErrInvalidKey, field, value)
	}
	return nil
}
