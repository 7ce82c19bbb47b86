package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

// TestPgxBeginExec begins a transaction with its first statement in one
// round trip, on a pool and on a single connection: the transaction has the
// options asked for, the statement's arguments arrive as sent, and a
// failing statement leaves no transaction open and no connection taken.
func TestPgxBeginExec(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t)
	ctx := context.Background()
	schema := testenv.PostgresSchema(t, pool)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	table := `"` + schema + `".keys`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+table+` (k text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	insert := `INSERT INTO ` + table + ` (k) VALUES ($1) ON CONFLICT DO NOTHING`
	const key = `a'); DROP TABLE keys; --`

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for _, c := range []struct {
		name string
		db   *pgxv5.DB
		busy int32 // connections the test itself holds
	}{
		{"Pool", pgxv5.WrapPool(pool), 1},
		{"Conn", pgxv5.WrapConn(conn.Conn()), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `TRUNCATE `+table); err != nil {
				t.Fatal(err)
			}
			tx, n, err := c.db.BeginExec(ctx, sql.TxOptions{Isolation: sql.LevelSerializable}, insert, key)
			if err != nil || n != 1 {
				t.Fatalf("first insert: %d rows, %v", n, err)
			}
			var iso string
			if err := queryOne(ctx, tx, `SHOW transaction_isolation`, &iso); err != nil || iso != "serializable" {
				t.Fatalf("isolation %q, %v; want serializable", iso, err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			var got string
			if err := pool.QueryRow(ctx, `SELECT k FROM `+table).Scan(&got); err != nil || got != key {
				t.Fatalf("stored %q, %v; want %q", got, err, key)
			}

			tx, n, err = c.db.BeginExec(ctx, sql.TxOptions{}, insert, key)
			if err != nil || n != 0 {
				t.Fatalf("second insert: %d rows, %v; want 0", n, err)
			}
			sqladapters.Rollback(tx)

			_, _, err = c.db.BeginExec(ctx, sql.TxOptions{}, `INSERT INTO `+table+`_missing (k) VALUES ($1)`, key)
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "42P01" {
				t.Fatalf("missing table: got %v, want SQLSTATE 42P01", err)
			}
			if n := pool.Stat().AcquiredConns(); n != c.busy {
				t.Fatalf("%d connections acquired after a failed BeginExec, want %d", n, c.busy)
			}
			// The connection is outside any transaction (a pool destroys
			// a connection released in one) and usable.
			if s := conn.Conn().PgConn().TxStatus(); s != 'I' {
				t.Fatalf("the test's connection has transaction status %q", s)
			}
			var one int
			if err := queryOne(ctx, c.db, `SELECT 1`, &one); err != nil || one != 1 {
				t.Fatalf("after a failed BeginExec: %d, %v", one, err)
			}
		})
	}
}

func queryOne(ctx context.Context, e sqladapters.Executor, q string, dest ...any) error {
	rows, err := e.Query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		return errors.Join(rows.Err(), errors.New("no row"))
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}
