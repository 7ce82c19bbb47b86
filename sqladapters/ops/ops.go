package ops

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// Defaults of the operations.
const (
	// DefaultBatchSize is the number of rows Requeue, Discard and Prune
	// change per statement when the caller does not say.
	DefaultBatchSize = 1000
	// MaxBatchSize bounds every batch and page size.
	MaxBatchSize = 50000
	// DefaultListLimit is the page size of ListDeadLetters and the number
	// of groups of GroupDeadLetters when the caller passes 0.
	DefaultListLimit = 100
)

// ErrNotFound is returned by ShowDeadLetter when no dead row has the id.
var ErrNotFound = errors.New("millbox: no such dead letter")

// ErrEverything is returned by Requeue and Discard for a Filter that
// selects every dead letter without saying so with Filter.All.
var ErrEverything = errors.New("millbox: the filter selects every dead letter")

// Ops runs operations on one millbox installation. It is safe for
// concurrent use.
type Ops struct {
	db sqladapters.Executor
	d  sqladapters.Dialect
}

// New returns the operations on the installation d describes, run on db (a
// database handle such as pgxv5.WrapPool(pool) or stdsql.WrapDB(db)).
func New(db sqladapters.Executor, d sqladapters.Dialect) (*Ops, error) {
	if db == nil {
		return nil, errors.New("millbox: ops.New: nil database")
	}
	if d == nil {
		return nil, errors.New("millbox: ops.New: nil dialect")
	}
	return &Ops{db: db, d: d}, nil
}

// Dialect returns the dialect the operations run with.
func (o *Ops) Dialect() sqladapters.Dialect { return o.d }

// Filter selects dead letters: every set field must match. The zero
// Filter matches every dead letter; Requeue and Discard take it only with
// Filter.All set.
type Filter = sqladapters.DeadLetterFilter

// opError names the operation that failed. It leaves out the "millbox: "
// its cause starts with, so that a message carries the prefix once.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "millbox: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "millbox: ")
}

func (e *opError) Unwrap() error { return e.err }

// fail wraps err with the operation's name; the dialect has classified it
// already, so a missing table says how to create it.
func fail(op string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op: op, err: err}
}

func limitOf(n int) (int, error) {
	n = cmp.Or(n, DefaultListLimit)
	if n < 1 || n > MaxBatchSize {
		return 0, fmt.Errorf("%w: limit must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, MaxBatchSize, n)
	}
	return n, nil
}

func batchSize(n int) (int, error) {
	n = cmp.Or(n, DefaultBatchSize)
	if n < 1 || n > MaxBatchSize {
		return 0, fmt.Errorf("%w: batch size must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, MaxBatchSize, n)
	}
	return n, nil
}
