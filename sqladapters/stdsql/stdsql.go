package stdsql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/millbox/millbox/sqladapters"
)

type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// executor runs statements on q. failed, when set, sees every error.
type executor struct {
	q      querier
	failed func(error)
}

func (e executor) check(err error) error {
	if err != nil && e.failed != nil {
		e.failed(err)
	}
	return mapErr(err)
}

func (e executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := e.q.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, e.check(err)
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
		return nil, e.check(err)
	}
	return &rowsAdapter{r: rows, e: e}, nil
}

type rowsAdapter struct {
	r     *sql.Rows
	e     executor
	close func(err error) // returns the connection the rows hold, if any
}

func (r *rowsAdapter) Next() bool             { return r.r.Next() }
func (r *rowsAdapter) Scan(dest ...any) error { return r.r.Scan(dest...) }
func (r *rowsAdapter) Err() error             { return r.e.check(r.r.Err()) }
func (r *rowsAdapter) Close() {
	_ = r.r.Close()
	if r.close != nil {
		r.close(r.r.Err())
		r.close = nil
	}
}

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
	// conn is the connection a transaction the DB began holds; drop tells
	// that it failed in a way that discards it.
	conn *sql.Conn
	drop atomic.Bool
}

// WrapTx adapts tx. The caller keeps owning it.
func WrapTx(tx *sql.Tx) *Tx { return &Tx{executor: executor{q: tx}, tx: tx} }

// Commit commits the transaction. database/sql's Commit takes no context.
func (t *Tx) Commit(context.Context) error { return t.end(t.tx.Commit()) }

// Rollback rolls the transaction back.
func (t *Tx) Rollback(context.Context) error { return t.end(t.tx.Rollback()) }

// end returns the connection of a transaction the DB began to its pool,
// or discards it.
func (t *Tx) end(err error) error {
	err = t.check(err)
	if c := t.conn; c != nil {
		t.conn = nil
		release(c, t.drop.Load())
	}
	return err
}

// Unwrap returns the *sql.Tx.
func (t *Tx) Unwrap() any { return t.tx }

// TxFromContext returns the *sql.Tx that sqladapters.WithTx (or the inbox
// middleware) put into ctx.
func TxFromContext(ctx context.Context) (*sql.Tx, error) {
	return sqladapters.DriverTxFromContext[*sql.Tx](ctx)
}

// DB adapts a *sql.DB.
//
// Each statement and transaction takes a connection of the pool for
// itself (sql.DB.Conn), so that one whose server went away or cannot
// write (see DropsConnection) is discarded rather than given back:
// database/sql would otherwise keep a connection to a primary that was
// demoted or fenced (its writes failing with SQLSTATE 25006), while new
// connections of a multi-host connection string with
// target_session_attrs=read-write go to the new primary.
type DB struct {
	db *sql.DB
}

// WrapDB adapts db.
func WrapDB(db *sql.DB) *DB { return &DB{db: db} }

// Exec implements sqladapters.Executor.
func (d *DB) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	var failed error
	n, err := executor{q: c, failed: func(err error) { failed = err }}.Exec(ctx, query, args...)
	release(c, DropsConnection(failed))
	return n, err
}

// Query implements sqladapters.Executor. The rows hold a connection
// until they are closed.
func (d *DB) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	var failed error
	e := executor{q: c, failed: func(err error) { failed = err }}
	rows, err := e.Query(ctx, query, args...)
	if err != nil {
		release(c, DropsConnection(failed))
		return nil, err
	}
	ra := rows.(*rowsAdapter)
	ra.close = func(err error) { release(c, DropsConnection(failed) || DropsConnection(err)) }
	return ra, nil
}

// Begin starts a transaction on a connection it holds until Commit or
// Rollback.
func (d *DB) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	c, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := c.BeginTx(ctx, &opts)
	if err != nil {
		release(c, DropsConnection(err))
		return nil, err
	}
	t := WrapTx(tx)
	t.conn = c
	t.failed = func(err error) {
		// A write refused in a transaction begun read-only says nothing
		// of the server.
		if DropsConnection(err) && !(opts.ReadOnly && sqlState(err) == readOnlyTx) {
			t.drop.Store(true)
		}
	}
	return t, nil
}

// Unwrap returns the *sql.DB.
func (d *DB) Unwrap() any { return d.db }

// release gives c back to its pool, or discards it.
func release(c *sql.Conn, drop bool) {
	if drop {
		// database/sql closes a connection whose use reports
		// driver.ErrBadConn, instead of pooling it.
		_ = c.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = c.Close()
}

// readOnlyTx is SQLSTATE read_only_sql_transaction.
const readOnlyTx = "25006"

// sqlState returns the SQLSTATE of a driver's error that tells it (pgx's
// and lib/pq's errors have a SQLState method), or "".
func sqlState(err error) string {
	var se interface{ SQLState() string }
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// DropsConnection tells whether err says that the server of the
// connection went away or cannot write, so that the connection should not
// be used again: PostgreSQL refused a write as read-only (SQLSTATE 25006: a
// primary demoted, or fenced with default_transaction_read_only), ended
// the session (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now, class 08 connection exception), or the connection
// broke (driver.ErrBadConn, EOF, a network error). The end of the
// caller's context is not. SQLSTATEs are read from drivers whose errors
// have a SQLState method (pgx, lib/pq).
func DropsConnection(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	switch s := sqlState(err); {
	case s == readOnlyTx, s == "57P01", s == "57P02", s == "57P03", strings.HasPrefix(s, "08"):
		return true
	case s != "":
		return false
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.As(err, &ne) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
