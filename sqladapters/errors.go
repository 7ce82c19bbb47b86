package sqladapters

import (
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters/startstop"
)

var (
	// ErrNoTx is returned when an operation that must run inside the
	// caller's transaction finds none. millbox never falls back to
	// autocommit.
	ErrNoTx = errors.New("millbox: no transaction")

	// ErrWrongTxType is returned by DriverTxFromContext when the context
	// holds a transaction of another driver.
	ErrWrongTxType = errors.New("millbox: transaction of another driver")

	// ErrTxDone is returned when a transaction was already committed or
	// rolled back.
	ErrTxDone = errors.New("millbox: transaction already committed or rolled back")

	// ErrMissingTable is returned when a millbox table does not exist.
	// The error text says how to create it.
	ErrMissingTable = errors.New("millbox: table does not exist")

	// ErrDuplicate is returned when a unique key rejected a row.
	ErrDuplicate = errors.New("millbox: duplicate key")

	// ErrInvalidName is returned for a schema or table name that is not a
	// plain SQL identifier.
	ErrInvalidName = errors.New("millbox: invalid identifier")

	// ErrInvalidConfig is returned by every millbox constructor for a bad
	// config; the error names the field and the rule. The packages
	// forwarder, inbox and middleware re-export it.
	ErrInvalidConfig = startstop.ErrInvalidConfig

	// ErrClosed is returned by a closed publisher, forwarder or cleaner:
	// it is startstop.ErrClosed, which the packages forwarder,
	// forwarder/destination and inbox re-export.
	ErrClosed = startstop.ErrClosed
)

// MissingTableError reports a millbox table that does not exist and says
// how to create it.
type MissingTableError struct {
	// Dialect is the name of the database, such as "postgres".
	Dialect string
	// Err is the driver's error, which names the table.
	Err error
	// Fleet tells that the table is one of a forwarder fleet's control
	// tables (FleetStore), which MigrateFleet creates.
	Fleet bool
}

func (e *MissingTableError) Error() string {
	if e.Fleet {
		return fmt.Sprintf("millbox: %s: a control table of the fleet does not exist (%v); create the tables with "+
			"sqladapters.MigrateFleet(ctx, db, store), or apply the SQL of the store's MigrationScript() "+
			"with your migration tool", e.Dialect, e.Err)
	}
	return fmt.Sprintf("millbox: %s: a millbox table does not exist (%v); create the tables with "+
		"sqladapters.Migrate(ctx, db, dialect), or apply the SQL of sqladapters.MigrationSQL(dialect) "+
		"with your migration tool", e.Dialect, e.Err)
}

// Unwrap returns the driver error.
func (e *MissingTableError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrMissingTable) true.
func (e *MissingTableError) Is(target error) bool { return target == ErrMissingTable }

// SettingMismatchError is returned by Dialect.HeartbeatSettings when
// another live forwarder instance of the same outbox recorded a setting
// that all of them must agree on with another value. errors.Is(err,
// ErrInvalidConfig) is true.
type SettingMismatchError struct {
	// Setting is the setting's name, such as "DeadLetterHoldsKey".
	Setting string
	// Mine is the value this instance gave, Theirs the one Instance
	// recorded.
	Mine, Theirs string
	// Instance is the live instance that recorded Theirs.
	Instance string
}

func (e *SettingMismatchError) Error() string {
	return fmt.Sprintf("millbox: invalid config: %s is %q here but %q on the live forwarder instance %q of the same outbox; "+
		"every instance of one outbox must use the same value (stop the others, or give this one theirs)",
		e.Setting, e.Mine, e.Theirs, e.Instance)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *SettingMismatchError) Is(target error) bool { return target == ErrInvalidConfig }
