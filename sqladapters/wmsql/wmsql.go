package wmsql

import (
	"context"
	stdsqlpkg "database/sql"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// WrapTx adapts a watermill-sql transaction.
func WrapTx(tx wsql.Tx) sqladapters.Tx {
	switch t := tx.(type) {
	case wsql.PgxTx:
		return pgxv5.WrapTx(t.Tx)
	case *wsql.PgxTx:
		return pgxv5.WrapTx(t.Tx)
	case wsql.StdSQLTx:
		return stdsql.WrapTx(t.Tx)
	case *wsql.StdSQLTx:
		return stdsql.WrapTx(t.Tx)
	}
	return &genericTx{executor: executor{tx}, tx: tx}
}

// WrapBeginner adapts a watermill-sql Beginner (sql.BeginnerFromPgx or
// sql.BeginnerFromStdSQL).
func WrapBeginner(b wsql.Beginner) sqladapters.DB {
	switch t := b.(type) {
	case wsql.PgxBeginner:
		if db := fromPgxConn(t.Conn); db != nil {
			return db
		}
		return &pgxConnDB{genericDB: genericDB{executor: executor{b}, b: b}, conn: t.Conn}
	case wsql.StdSQLBeginner:
		if db, ok := t.SQLBeginner.(*stdsqlpkg.DB); ok {
			return stdsql.WrapDB(db)
		}
	}
	return &genericDB{executor: executor{b}, b: b}
}

func fromPgxConn(c wsql.Conn) sqladapters.DB {
	switch conn := c.(type) {
	case *pgxpool.Pool:
		return pgxv5.WrapPool(conn)
	case *pgx.Conn:
		return pgxv5.WrapConn(conn)
	}
	return nil
}

type executor struct{ e wsql.ContextExecutor }

func (x executor) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := x.e.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (x executor) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	rows, err := x.e.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return &genericRows{r: rows}, nil
}

type genericRows struct{ r wsql.Rows }

func (r *genericRows) Next() bool             { return r.r.Next() }
func (r *genericRows) Scan(dest ...any) error { return r.r.Scan(dest...) }
func (r *genericRows) Close()                 { _ = r.r.Close() }

// Err reports iteration errors when the underlying rows expose them.
func (r *genericRows) Err() error {
	if e, ok := r.r.(interface{ Err() error }); ok {
		return e.Err()
	}
	return nil
}

type genericTx struct {
	executor
	tx wsql.Tx
}

func (t *genericTx) Commit(context.Context) error   { return t.tx.Commit() }
func (t *genericTx) Rollback(context.Context) error { return t.tx.Rollback() }
func (t *genericTx) Unwrap() any                    { return t.tx }

type genericDB struct {
	executor
	b wsql.Beginner
}

func (d *genericDB) Begin(ctx context.Context, opts stdsqlpkg.TxOptions) (sqladapters.Tx, error) {
	tx, err := d.b.BeginTx(ctx, &opts)
	if err != nil {
		return nil, err
	}
	return WrapTx(tx), nil
}

func (d *genericDB) Unwrap() any { return d.b }

// pgxConnDB adapts a watermill-sql pgx connection that is neither a pool
// nor a *pgx.Conn. watermill-sql begins its transactions SERIALIZABLE when
// no isolation level is asked for; this adapter keeps the database's
// default level then, as the other adapters do, so that concurrent
// transactions wait for each other instead of failing with serialization
// errors.
type pgxConnDB struct {
	genericDB
	conn wsql.Conn
}

func (d *pgxConnDB) Begin(ctx context.Context, opts stdsqlpkg.TxOptions) (sqladapters.Tx, error) {
	if opts.Isolation != stdsqlpkg.LevelDefault {
		return d.genericDB.Begin(ctx, opts)
	}
	var o pgx.TxOptions
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	tx, err := d.conn.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return pgxv5.WrapTx(tx), nil
}
