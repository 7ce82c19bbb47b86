// Package wmsql lets users of watermill-sql/v4 pass what they already hold:
// a sql.Tx (from sql.TxFromPgx or sql.TxFromStdSQL) or a sql.Beginner.
// Transactions that wrap a pgx.Tx or a *sql.Tx are unwrapped and run
// natively, which also avoids watermill-sql's PgxTx.Rollback, which panics
// on a transaction made by TxFromPgx (it has no context).
package wmsql
