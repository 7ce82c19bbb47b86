package pgxv5

import (
	"cmp"
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"

	"github.com/millbox/millbox/sqladapters"
)

// BeginExec begins a transaction and runs query in it, and returns the
// transaction and the number of rows query affected. BEGIN and query go to
// the server together, in one round trip (pgx's Batch.BeginTx), instead of
// the two of Begin followed by Exec; query is sent with its arguments as
// parameters, as Exec sends it. The inbox middleware records a message
// this way.
//
// When either statement fails, the transaction is rolled back (which
// returns a pooled connection to the pool) and only the error is returned.
func (d *DB) BeginExec(ctx context.Context, opts sql.TxOptions, query string, args ...any) (sqladapters.Tx, int64, error) {
	o, err := txOptions(opts)
	if err != nil {
		return nil, 0, err
	}
	var b pgx.Batch
	b.BeginTx(o)
	b.Queue(query, args...)
	br := d.b.SendBatch(ctx, &b)
	// The transaction exists from here on; with a pool it holds the
	// connection until it is committed or rolled back, also when the
	// batch failed.
	tx := d.wrapTx(br.Tx(), opts.ReadOnly)
	_, err = br.Exec() // BEGIN
	var n int64
	if err == nil {
		tag, qerr := br.Exec()
		n, err = tag.RowsAffected(), qerr
	}
	if err = cmp.Or(err, br.Close()); err != nil {
		sqladapters.Rollback(tx)
		return nil, 0, d.check(err)
	}
	return tx, n, nil
}
