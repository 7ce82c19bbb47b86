package ops

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
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

var (
	// ErrNotFound is returned by ShowDeadLetter when no dead row has the
	// id.
	ErrNotFound = errors.New("millbox: ops: no such dead letter")
	// ErrUnsupportedDialect is returned by New for a dialect that is not
	// one of millbox's database packages.
	ErrUnsupportedDialect = errors.New("millbox: ops: the dialect is not one of sqladapters/postgres, mysql or sqlite")
)

// Ops runs operations on one millbox installation. It is safe for
// concurrent use.
type Ops struct {
	db      sqladapters.Executor
	dialect sqladapters.Dialect
	d       builder
}

// New returns the operations on the installation d describes, run on db (a
// database handle such as pgxv5.WrapPool(pool) or stdsql.WrapDB(db)). It
// fails with ErrUnsupportedDialect when d is not one of millbox's database
// packages.
func New(db sqladapters.Executor, d sqladapters.Dialect) (*Ops, error) {
	if db == nil {
		return nil, errors.New("millbox: ops.New: nil database")
	}
	if d == nil {
		return nil, errors.New("millbox: ops.New: nil dialect")
	}
	b, _ := sqlstore.BuilderOf(d)
	od, ok := b.(builder)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrUnsupportedDialect, d)
	}
	return &Ops{db: db, dialect: d, d: od}, nil
}

// Dialect returns the dialect the operations run with.
func (o *Ops) Dialect() sqladapters.Dialect { return o.dialect }

// Filter selects dead letters. Every set field must match; the zero Filter
// matches every dead letter.
type Filter struct {
	// IDs, when not empty, limits the dead letters to these ids.
	IDs []int64
	// Topic, when set, is the exact topic.
	Topic string
	// Key, when set, is the exact ordering key.
	Key string
	// ErrorContains, when set, is a case-sensitive substring of the last
	// error.
	ErrorContains string
	// OlderThan, when positive, keeps dead letters that died longer ago
	// than this.
	OlderThan time.Duration
	// NewerThan, when positive, keeps dead letters that died within this
	// long.
	NewerThan time.Duration
}

// IsZero reports whether f matches every dead letter.
func (f Filter) IsZero() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.ErrorContains == "" && f.OlderThan <= 0 && f.NewerThan <= 0
}

// Where turns f into the dialect's Where, with ages measured back from
// now.
func (f Filter) Where(now time.Time) Where {
	w := Where{IDs: f.IDs, Topic: f.Topic, Key: f.Key, ErrorContains: f.ErrorContains}
	if f.OlderThan > 0 {
		w.DeadBefore = now.Add(-f.OlderThan)
	}
	if f.NewerThan > 0 {
		w.DeadAfter = now.Add(-f.NewerThan)
	}
	return w
}

// fail wraps err with the operation's name, classified by the dialect so
// that a missing table says how to create it.
func (o *Ops) fail(op string, err error) error {
	return fmt.Errorf("millbox: %s: %w", op, o.d.ClassifyError(err))
}

// query runs q and calls scan for every row.
func (o *Ops) query(ctx context.Context, op string, q sqladapters.Query, scan func(sqladapters.Rows) error) error {
	rows, err := q.Query(ctx, o.db)
	if err != nil {
		return o.fail(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return o.fail(op, err)
		}
	}
	if err := rows.Err(); err != nil {
		return o.fail(op, err)
	}
	return nil
}

// count runs a query selecting one integer.
func (o *Ops) count(ctx context.Context, op string, q sqladapters.Query) (int64, error) {
	var n int64
	err := o.query(ctx, op, q, func(r sqladapters.Rows) error { return r.Scan(&n) })
	return n, err
}

// ids runs a query selecting one id column.
func (o *Ops) ids(ctx context.Context, op string, q sqladapters.Query) ([]int64, error) {
	var ids []int64
	err := o.query(ctx, op, q, func(r sqladapters.Rows) error {
		var id int64
		if err := r.Scan(&id); err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	return ids, err
}

func micros(v sql.NullInt64) time.Duration {
	if !v.Valid {
		return 0
	}
	return time.Duration(v.Int64) * time.Microsecond
}

func batchSize(n int) (int, error) {
	n = cmp.Or(n, DefaultBatchSize)
	if n < 1 || n > MaxBatchSize {
		return 0, fmt.Errorf("%w: batch size must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, MaxBatchSize, n)
	}
	return n, nil
}
