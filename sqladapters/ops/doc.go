// Package ops holds the operations an operator runs on a millbox
// installation without writing code or SQL: the status of the outbox and
// inbox, dead-letter search, grouping, inspection, requeue and discard, and
// pruning of forwarded rows and old inbox records.
//
// The millbox command (sqladapters/cmd/millbox) and the admin page
// (sqladapters/admin) are thin front ends over it. Build an Ops with New
// from a database handle and a dialect:
//
//	o, err := ops.New(pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{}))
//	st, err := o.Status(ctx)
//	n, err := o.Requeue(ctx, ops.Filter{ErrorContains: "connection refused"})
//
// The SQL lives with each database's dialect: sqladapters/postgres,
// sqladapters/mysql and sqladapters/sqlite build the statements these
// operations need beyond the store contract.
//
// Every operation is safe while forwarders and consumers run: none of them
// touches a pending outbox row except Requeue, which only makes dead rows
// pending again, and each change runs in bounded batches of single
// statements rather than one long transaction.
package ops
