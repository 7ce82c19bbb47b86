package inbox

import (
	"context"
	"database/sql"
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
	if err := validateKeys(consumer, messageID); err != nil {
		return false, err
	}
	return i.record(ctx, tx, consumer, messageID)
}

func validateKeys(consumer, messageID string) error {
	if err := ValidateKey("consumer", consumer); err != nil {
		return err
	}
	return ValidateKey("message id", messageID)
}

// record runs the inbox insert of valid keys in tx.
func (i *Inbox) record(ctx context.Context, tx sqladapters.Tx, consumer, messageID string) (bool, error) {
	first, err := i.d.RecordInbox(ctx, tx, consumer, messageID)
	if err != nil {
		return false, recordError(consumer, messageID, err)
	}
	return first, nil
}

func recordError(consumer, messageID string, err error) error {
	return fmt.Errorf("millbox: inbox: record message %q for consumer %q: %w", messageID, consumer, err)
}

// BeginExecer is implemented by a sqladapters.DB that can begin a
// transaction and run a first statement in it in one round trip, such as
// pgxv5.DB.
type BeginExecer = sqladapters.BeginExecer

// BeginRecord begins a transaction on db with opts and records in it that
// consumer has processed messageID, as Begin followed by Record would. On a
// db that implements BeginExecer the BEGIN and the record go to the
// database in one round trip, which is what the inbox middleware costs
// beyond a transaction of the handler's own.
//
// It returns the open transaction and true the first time: do the work in
// tx and commit it. For a duplicate it rolls the transaction back and
// returns a nil tx and false. On error no transaction is left open.
func (i *Inbox) BeginRecord(ctx context.Context, db sqladapters.DB, opts sql.TxOptions, consumer, messageID string) (tx sqladapters.Tx, first bool, err error) {
	if err := validateKeys(consumer, messageID); err != nil {
		return nil, false, err
	}
	tx, first, err = i.d.BeginRecordInbox(ctx, db, opts, consumer, messageID)
	if err != nil {
		return nil, false, recordError(consumer, messageID, err)
	}
	return tx, first, nil
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
