package sqladapters

import (
	"context"
	"fmt"
)

type txContextKey struct{}

// WithTx returns a copy of ctx that carries tx. The outbox publisher in
// context mode and the inbox middleware use it to share one transaction.
func WithTx(ctx context.Context, tx Tx) context.Context {
	return context.WithValue(ctx, txContextKey{}, tx)
}

// TxFromContext returns the transaction WithTx put into ctx, or an error
// wrapping ErrNoTx when there is none.
func TxFromContext(ctx context.Context) (Tx, error) {
	if ctx == nil {
		return nil, fmt.Errorf("%w: nil context", ErrNoTx)
	}
	tx, ok := ctx.Value(txContextKey{}).(Tx)
	if !ok || tx == nil {
		return nil, fmt.Errorf("%w: put one there with sqladapters.WithTx (the inbox middleware does it for handlers)", ErrNoTx)
	}
	return tx, nil
}

// DriverTxFromContext returns the driver transaction of type T that WithTx
// put into ctx (for example pgx.Tx or *sql.Tx). It fails with ErrNoTx when
// ctx carries no transaction, and with ErrWrongTxType when it carries one of
// another driver.
func DriverTxFromContext[T any](ctx context.Context) (T, error) {
	var zero T
	tx, err := TxFromContext(ctx)
	if err != nil {
		return zero, err
	}
	var v any = tx
	if u, ok := tx.(Unwrapper); ok {
		v = u.Unwrap()
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("%w: context holds %T, want %T", ErrWrongTxType, v, zero)
	}
	return t, nil
}
