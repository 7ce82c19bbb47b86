package pgxv5

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
)

// querier is what pgx.Tx, *pgx.Conn and *pgxpool.Pool have in common.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// executor runs statements on q. failed, when set, sees every error:
// the pool's adapter drops its connections when the server went away.
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
	tag, err := e.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, e.check(err)
	}
	return tag.RowsAffected(), nil
}

func (e executor) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	rows, err := e.q.Query(ctx, query, args...)
	if err != nil {
		return nil, e.check(err)
	}
	return rowsAdapter{rows, e}, nil
}

type rowsAdapter struct {
	pgx.Rows
	e executor
}

func (r rowsAdapter) Err() error { return r.e.check(r.Rows.Err()) }

func mapErr(err error) error {
	if errors.Is(err, pgx.ErrTxClosed) {
		return fmt.Errorf("%w: %w", sqladapters.ErrTxDone, err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "26000" || pe.Code == "42P05") {
		// invalid_sql_statement_name, duplicate_prepared_statement: pgx's
		// cached prepared statements met a connection pooler that moves
		// a client between server connections.
		return fmt.Errorf("%w (behind PgBouncer in transaction pooling, add default_query_exec_mode=exec to the connection string)", err)
	}
	return err
}

// Tx adapts a pgx.Tx.
type Tx struct {
	executor
	tx pgx.Tx
}

// WrapTx adapts tx. The caller keeps owning it: millbox only runs
// statements in it, and commits or rolls back only when asked through the
// returned value.
func WrapTx(tx pgx.Tx) *Tx { return &Tx{executor: executor{q: tx}, tx: tx} }

// Commit commits the transaction.
func (t *Tx) Commit(ctx context.Context) error { return t.check(t.tx.Commit(ctx)) }

// Rollback rolls the transaction back.
func (t *Tx) Rollback(ctx context.Context) error { return t.check(t.tx.Rollback(ctx)) }

// Unwrap returns the pgx.Tx.
func (t *Tx) Unwrap() any { return t.tx }

// TxFromContext returns the pgx.Tx that sqladapters.WithTx (or the inbox
// middleware) put into ctx.
func TxFromContext(ctx context.Context) (pgx.Tx, error) {
	return sqladapters.DriverTxFromContext[pgx.Tx](ctx)
}

type beginner interface {
	querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// DB adapts a *pgxpool.Pool or a *pgx.Conn.
type DB struct {
	executor
	b      beginner
	pool   *pgxpool.Pool
	listen listenConfig
	// pooled is set once the listener's connection proved to be shared
	// per transaction by a pooler: Listen then fails at once.
	pooled atomic.Bool
	// reset is when the pool's connections were last dropped (unix ns).
	reset atomic.Int64
}

// WrapPool adapts a pool. It can also listen for notifications: on a
// connection taken from the pool, or with ListenOn on a connection of its
// own, which a pool behind PgBouncer in transaction pooling needs.
//
// When a statement of the DB, or of a transaction it began, finds that the
// server went away or cannot write (see DropsConnection), the DB drops
// every connection of the pool (pgxpool.Pool.Reset): pgx checks
// target_session_attrs only when it opens a connection, so a pool would
// otherwise keep its connections to a dead or demoted primary, while new
// ones go to whichever server of a multi-host connection string now
// accepts writes.
func WrapPool(p *pgxpool.Pool, opts ...Option) *DB {
	d := &DB{b: p, pool: p}
	d.executor = executor{q: p, failed: d.failed}
	for _, o := range opts {
		o(d)
	}
	return d
}

// WrapConn adapts a single connection. A connection runs one statement at
// a time, so prefer WrapPool for the forwarder.
func WrapConn(c *pgx.Conn) *DB { return &DB{executor: executor{q: c}, b: c} }

// Begin starts a transaction.
func (d *DB) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	o, err := txOptions(opts)
	if err != nil {
		return nil, err
	}
	tx, err := d.b.BeginTx(ctx, o)
	if err != nil {
		return nil, d.check(err)
	}
	return d.wrapTx(tx, opts.ReadOnly), nil
}

// wrapTx adapts a transaction the DB began: its failures count as the
// DB's, but a write refused in a transaction begun read-only, which says
// nothing of the server.
func (d *DB) wrapTx(tx pgx.Tx, readOnly bool) *Tx {
	t := WrapTx(tx)
	if d.pool != nil {
		t.failed = d.failed
		if readOnly {
			t.failed = func(err error) {
				if sqlState(err) != readOnlyTx {
					d.failed(err)
				}
			}
		}
	}
	return t
}

// resetEvery bounds how often failures reset the pool: one failure of a
// server that went away is followed by the failures of the statements
// that were running on it, which need no reset of their own.
const resetEvery = time.Second

// failed resets the pool when err says that the server went away or
// cannot write.
func (d *DB) failed(err error) {
	if d.pool == nil || !DropsConnection(err) {
		return
	}
	now := time.Now().UnixNano()
	last := d.reset.Load()
	if now-last < int64(resetEvery) || !d.reset.CompareAndSwap(last, now) {
		return
	}
	d.pool.Reset()
}

// readOnlyTx is SQLSTATE read_only_sql_transaction.
const readOnlyTx = "25006"

func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// DropsConnection tells whether err says that the server of the
// connection went away or cannot write, so that a pool should drop its
// connections to it: the server refused a write as read-only (SQLSTATE
// 25006: a primary demoted, or fenced with default_transaction_read_only),
// ended the session (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03
// cannot_connect_now, class 08 connection exception), or the connection
// broke (EOF, a network error). An error of connecting is not (there is no
// connection to drop), nor the end of the caller's context. A pool adapted by WrapPool drops its connections by
// itself; a pool of the application, whose transactions the outbox
// Publisher writes in, can do the same with this function (see the
// package doc, "Failover").
func DropsConnection(err error) bool {
	if err == nil {
		return false
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// Nothing to drop, or the caller gave up: a slow statement says
		// nothing of the server.
		return false
	}
	switch s := sqlState(err); {
	case s == readOnlyTx, s == "57P01", s == "57P02", s == "57P03", strings.HasPrefix(s, "08"):
		return true
	case s != "":
		return false
	}
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Unwrap returns the *pgxpool.Pool or *pgx.Conn.
func (d *DB) Unwrap() any { return d.b }

func txOptions(o sql.TxOptions) (pgx.TxOptions, error) {
	var out pgx.TxOptions
	switch o.Isolation {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		out.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		out.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		out.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		out.IsoLevel = pgx.Serializable
	default:
		return out, fmt.Errorf("millbox: pgxv5: isolation level %v is not supported by Postgres", o.Isolation)
	}
	if o.ReadOnly {
		out.AccessMode = pgx.ReadOnly
	}
	return out, nil
}
