package sqladapters_test

import (
	"context"
	"errors"
	"testing"

	"github.com/millbox/millbox/sqladapters"
)

func TestValidateIdentifierRejectsHostileNames(t *testing.T) {
	for _, name := range []string{"", "1abc", `out"box`, "out box", "outbox;DROP TABLE x", "x--", "ü", "a.b", "a`b",
		"abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklm"} {
		if err := sqladapters.ValidateIdentifier("Table", name); !errors.Is(err, sqladapters.ErrInvalidName) {
			t.Fatalf("%q accepted (err %v)", name, err)
		}
	}
	for _, name := range []string{"outbox", "_x", "Millbox_Outbox_2"} {
		if err := sqladapters.ValidateIdentifier("Table", name); err != nil {
			t.Fatalf("%q rejected: %v", name, err)
		}
	}
}

type fakeTx struct{ sqladapters.Tx }

func (fakeTx) Unwrap() any { return 42 }

func TestTxContext(t *testing.T) {
	ctx := context.Background()
	if _, err := sqladapters.TxFromContext(ctx); !errors.Is(err, sqladapters.ErrNoTx) {
		t.Fatalf("want ErrNoTx, got %v", err)
	}
	tx := fakeTx{}
	ctx = sqladapters.WithTx(ctx, tx)
	got, err := sqladapters.TxFromContext(ctx)
	if err != nil || got != tx {
		t.Fatalf("got %v, %v", got, err)
	}
	if v, err := sqladapters.DriverTxFromContext[int](ctx); err != nil || v != 42 {
		t.Fatalf("driver tx %v, %v", v, err)
	}
	if _, err := sqladapters.DriverTxFromContext[string](ctx); !errors.Is(err, sqladapters.ErrWrongTxType) {
		t.Fatalf("want ErrWrongTxType, got %v", err)
	}
}
