package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// beginExecDB is a sqladapters.DB with BeginExec whose first statement
// affects n rows or fails with err. It fails every other call.
type beginExecDB struct {
	sqladapters.DB // nil: Begin, Exec and Query must not be called
	n              int64
	err            error
	query          string
	args           []any
	tx             *fakeTx
}

func (d *beginExecDB) BeginExec(_ context.Context, _ sql.TxOptions, query string, args ...any) (sqladapters.Tx, int64, error) {
	d.query, d.args = query, args
	if d.err != nil {
		return nil, 0, d.err
	}
	d.tx = &fakeTx{}
	return d.tx, d.n, nil
}

type fakeTx struct {
	sqladapters.Tx // nil: only Rollback is called
	rolledBack     bool
}

func (t *fakeTx) Rollback(context.Context) error { t.rolledBack = true; return nil }

// On a DB with BeginExec, BeginRecord sends the dialect's inbox insert, with
// the keys as arguments, together with BEGIN, and rolls back what is not a
// first delivery.
func TestBeginRecordInOneRoundTrip(t *testing.T) {
	d := postgres.MustNew(postgres.Options{})
	ib, err := inbox.New(inbox.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	db := &beginExecDB{n: 1}
	tx, first, err := ib.BeginRecord(ctx, db, sql.TxOptions{}, "billing", "m'1")
	if err != nil || !first || tx != db.tx || db.tx.rolledBack {
		t.Fatalf("first delivery: got %v, %v, %v (rolled back %v)", tx, first, err, db.tx.rolledBack)
	}
	if !strings.Contains(db.query, "INSERT INTO "+d.InboxTable()) || len(db.args) != 2 || db.args[0] != "billing" || db.args[1] != "m'1" {
		t.Fatalf("sent %q %v, want the dialect's insert with the keys as arguments", db.query, db.args)
	}

	db = &beginExecDB{n: 0}
	if tx, first, err := ib.BeginRecord(ctx, db, sql.TxOptions{}, "billing", "m1"); err != nil || first || tx != nil || !db.tx.rolledBack {
		t.Fatalf("duplicate: got %v, %v, %v (rolled back %v); want no tx, false, rolled back", tx, first, err, db.tx.rolledBack)
	}

	db = &beginExecDB{n: 2}
	if tx, _, err := ib.BeginRecord(ctx, db, sql.TxOptions{}, "billing", "m1"); err == nil || tx != nil || !db.tx.rolledBack ||
		!strings.Contains(err.Error(), "affected 2 rows") {
		t.Fatalf("two rows: got %v, %v (rolled back %v); want an error and a rollback", tx, err, db.tx.rolledBack)
	}

	boom := errors.New("boom")
	db = &beginExecDB{err: boom}
	if tx, _, err := ib.BeginRecord(ctx, db, sql.TxOptions{}, "billing", "m1"); !errors.Is(err, boom) || tx != nil {
		t.Fatalf("failure: got %v, %v; want the error and no tx", tx, err)
	}

	db = &beginExecDB{n: 1}
	if _, _, err := ib.BeginRecord(ctx, db, sql.TxOptions{}, "billing", ""); !errors.Is(err, inbox.ErrInvalidKey) || db.query != "" {
		t.Fatalf("empty id: got %v (sent %q); want ErrInvalidKey before the database", err, db.query)
	}
}
