package sqladapters

import (
	"context"
	"database/sql"
)

// Executor runs SQL. Both a transaction and a database handle are executors.
type Executor interface {
	// Exec runs a statement and reports how many rows it affected.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	// Query runs a statement that returns rows. The caller closes them.
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Rows is a result set being read.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Tx is an open database transaction. Commit and Rollback take a context
// because a transaction may outlive the context of the call that began it.
type Tx interface {
	Executor
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// DB begins transactions and runs statements outside of one.
type DB interface {
	Executor
	Begin(ctx context.Context, opts sql.TxOptions) (Tx, error)
}

// Unwrapper is implemented by adapters that can hand back the driver value
// they wrap (a pgx.Tx, a *sql.Tx, ...).
type Unwrapper interface {
	Unwrap() any
}

// Query is one SQL statement with its arguments.
type Query struct {
	SQL  string
	Args []any
}

// Exec runs q on e.
func (q Query) Exec(ctx context.Context, e Executor) (int64, error) {
	return e.Exec(ctx, q.SQL, q.Args...)
}

// Query runs q on e and returns its rows.
func (q Query) Query(ctx context.Context, e Executor) (Rows, error) {
	return e.Query(ctx, q.SQL, q.Args...)
}

// Listener is implemented by DB adapters that can wait for database
// notifications (Postgres LISTEN through pgx). The forwarder uses it to wake
// up as soon as an outbox write commits.
type Listener interface {
	// Listen subscribes to channel on a dedicated connection, calls ready
	// once subscribed and notify for each notification, and blocks until
	// ctx ends (returning nil) or the connection fails (returning the
	// error).
	Listen(ctx context.Context, channel string, ready, notify func()) error
}
