package pgxv5

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
}

// DB adapts a *pgxpool.Pool or a *pgx.Conn.
type DB struct {
	executor
	b    beginner
	pool *pgxpool.Pool
}

// WrapPool adapts a pool. It can also listen for notifications.
func WrapPool(p *pgxpool.Pool) *DB { return &DB{executor: executor{p}, b: p, pool: p} }

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

// Listen implements sqladapters.Listener on a connection taken from the
// pool for as long as it listens. A DB made by WrapConn cannot listen.
func (d *DB) Listen(ctx context.Context, channel string, ready, notify func()) error {
	if d.pool == nil {
		return errors.New("millbox: pgxv5: a DB made by WrapConn cannot listen; use WrapPool")
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection leaves the pool for good: a connection that was
	// listening must not serve other queries afterwards.
	c := conn.Hijack()
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return err
	}
	ready()
	for {
		if _, err := c.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		notify()
	}
}

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
