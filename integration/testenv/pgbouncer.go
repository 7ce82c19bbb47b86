package testenv

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PgBouncerURL is PgBouncer in transaction pooling in front of the test
// Postgres, as .ci/pgbouncer starts it, with the pgx setting it needs
// (default_query_exec_mode=exec: no prepared statements kept across
// transactions).
func PgBouncerURL() string {
	return Env("MILLBOX_PGBOUNCER_URL", "postgres://root@127.0.0.1:6432/test?sslmode=disable&default_query_exec_mode=exec")
}

// PgBouncerOneURL is the same database through PgBouncer's pool of one
// server connection (database test_one in .ci/pgbouncer): every client
// shares that connection, so a test can see the session state clients
// leave behind on it.
func PgBouncerOneURL() string {
	return Env("MILLBOX_PGBOUNCER_ONE_URL", "postgres://root@127.0.0.1:6432/test_one?sslmode=disable&default_query_exec_mode=exec")
}

// PgBouncer returns a pool to url (PgBouncerURL or PgBouncerOneURL),
// closed after the test. An unreachable PgBouncer fails the test in CI and
// skips it elsewhere.
func PgBouncer(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse PgBouncer URL: %v", err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 20)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		Unavailable(t, "PgBouncer (bash .ci/pgbouncer)", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PgBouncerListening returns, for every server connection PgBouncer may
// hand a client of url (PgBouncerURL or PgBouncerOneURL), the channels it
// listens on, by server process id. It holds as many transactions at once
// as the pool has server connections, each on its own, so nobody else may
// use the pool meanwhile.
func PgBouncerListening(ctx context.Context, url string) (map[int][]string, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	size, err := pgBouncerPoolSize(ctx, cfg)
	if err != nil {
		return nil, err
	}
	out := map[int][]string{}
	for range size {
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close(context.WithoutCancel(ctx))
		tx, err := c.Begin(ctx) // keeps the server connection until the end
		if err != nil {
			return nil, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		var pid int
		var channels []string
		if err := tx.QueryRow(ctx, `SELECT pg_backend_pid(), coalesce(array_agg(c), '{}') FROM pg_listening_channels() c`).Scan(&pid, &channels); err != nil {
			return nil, err
		}
		out[pid] = channels
	}
	return out, nil
}

// pgBouncerPoolSize asks PgBouncer's admin console for the pool size of
// cfg's database.
func pgBouncerPoolSize(ctx context.Context, cfg *pgx.ConnConfig) (int, error) {
	admin := cfg.Copy()
	admin.Database = "pgbouncer"
	admin.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	c, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return 0, err
	}
	defer c.Close(context.WithoutCancel(ctx))
	rows, err := c.Query(ctx, "SHOW DATABASES")
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, err
		}
		row := map[string]any{}
		for i, fd := range rows.FieldDescriptions() {
			row[fd.Name] = vals[i]
		}
		if row["name"] == cfg.Database {
			n, err := strconv.Atoi(fmt.Sprint(row["pool_size"]))
			if err != nil {
				return 0, fmt.Errorf("pool_size %v: %w", row["pool_size"], err)
			}
			return n, nil
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("PgBouncer has no database %q", cfg.Database)
}
