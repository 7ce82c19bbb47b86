package pgxv5

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"

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

type executor struct{ q querier }

func (e executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := e.q.Exec(ctx, query, args...)
	if err != nil {
		return 0, mapErr(err)
	}
	return tag.RowsAffected(), nil
}

func (e executor) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	rows, err := e.q.Query(ctx, query, args...)
	if err != nil {
		return nil, mapErr(err)
	}
	return rowsAdapter{rows}, nil
}

type rowsAdapter struct{ pgx.Rows }

func (r rowsAdapter) Err() error { return mapErr(r.Rows.Err()) }

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
func WrapTx(tx pgx.Tx) *Tx { return &Tx{executor: executor{tx}, tx: tx} }

// Commit commits the transaction.
func (t *Tx) Commit(ctx context.Context) error { return mapErr(t.tx.Commit(ctx)) }

// Rollback rolls the transaction back.
func (t *Tx) Rollback(ctx context.Context) error { return mapErr(t.tx.Rollback(ctx)) }

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
}

// WrapPool adapts a pool. It can also listen for notifications: on a
// connection taken from the pool, or with ListenOn on a connection of its
// own, which a pool behind PgBouncer in transaction pooling needs.
func WrapPool(p *pgxpool.Pool, opts ...Option) *DB {
	d := &DB{executor: executor{p}, b: p, pool: p}
	for _, o := range opts {
		o(d)
	}
	return d
}

// WrapConn adapts a single connection. A connection runs one statement at
// a time, so prefer WrapPool for the forwarder.
func WrapConn(c *pgx.Conn) *DB { return &DB{executor: executor{c}, b: c} }

// Begin starts a transaction.
func (d *DB) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	o, err := txOptions(opts)
	if err != nil {
		return nil, err
	}
	tx, err := d.b.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return WrapTx(tx), nil
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
