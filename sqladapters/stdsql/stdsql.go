package stdsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters"
)

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type executor struct{ q querier }

func (e executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, mapErr(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("millbox: stdsql: rows affected: %w", err)
	}
	return n, nil
}

func (e executor) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	rows, err := e.q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	return rowsAdapter{rows}, nil
}

type rowsAdapter struct{ r *sql.Rows }

func (r rowsAdapter) Next() bool             { return r.r.Next() }
func (r rowsAdapter) Scan(dest ...any) error { return r.r.Scan(dest...) }
func (r rowsAdapter) Err() error             { return mapErr(r.r.Err()) }
func (r rowsAdapter) Close()                 { _ = r.r.Close() }

func mapErr(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("%w: %w", sqladapters.ErrTxDone, err)
	}
	return err
}

// Tx adapts a *sql.Tx.
type Tx struct {
	executor
	tx *sql.Tx
}

// WrapTx adapts tx. The caller keeps owning it.
func WrapTx(tx *sql.Tx) *Tx { return &Tx{executor: executor{tx}, tx: tx} }

// Commit commits the transaction. database/sql's Commit takes no context.
func (t *Tx) Commit(context.Context) error { return mapErr(t.tx.Commit()) }

// Rollback rolls the transaction back.
func (t *Tx) Rollback(context.Context) error { return mapErr(t.tx.Rollback()) }

// Unwrap returns the *sql.Tx.
func (t *Tx) Unwrap() any { return t.tx }

// TxFromContext returns the *sql.Tx that sqladapters.WithTx (or the inbox
// middleware) put into ctx.
func TxFromContext(ctx context.Context) (*sql.Tx, error) {
	return sqladapters.DriverTxFromContext[*sql.Tx](ctx)
}

// DB adapts a *sql.DB.
type DB struct {
	executor
	db *sql.DB
}

// WrapDB adapts db.
func WrapDB(db *sql.DB) *DB { return &DB{executor: executor{db}, db: db} }

// Begin starts a transaction.
func (d *DB) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	tx, err := d.db.BeginTx(ctx, &opts)
	if err != nil {
		return nil, err
	}
	return WrapTx(tx), nil
}

// Unwrap returns the *sql.DB.
func (d *DB) Unwrap() any { return d.db }
