// Package pgtest connects tests to the PostgreSQL server named by
// MILLBOX_POSTGRES_URL (default
// postgres://root@127.0.0.1:5432/test?sslmode=disable) and gives each test
// a schema of its own, dropped afterwards.
package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// URLVariable is the environment variable that holds the server's URL.
const URLVariable = "MILLBOX_POSTGRES_URL"

// URL is the server the tests use.
func URL() string {
	return dialecttest.Env(URLVariable, "postgres://root@127.0.0.1:5432/test?sslmode=disable")
}

// Pool returns a pool to the server at URL, closed after the test.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		t.Fatalf("parse %s: %v", URLVariable, err)
	}
	cfg.MaxConns = max(cfg.MaxConns, 20)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		if err = pool.Ping(ctx); err != nil {
			// The pool's health check would outlive the skipped test.
			pool.Close()
		}
	}
	if err != nil {
		dialecttest.Unavailable(t, "PostgreSQL", URLVariable, err)
	}
	t.Cleanup(func() { closePool(t, pool) })
	return pool
}

// closePool closes pool once its connections are back. A connection still
// out a few seconds after the test (a transaction the test left open)
// fails the test instead: Close would wait for it forever.
func closePool(t testing.TB, pool *pgxpool.Pool) {
	deadline := time.Now().Add(5 * time.Second)
	for pool.Stat().AcquiredConns() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := pool.Stat().AcquiredConns(); n > 0 {
		t.Errorf("pgtest: %d connection(s) still in use after the test: a transaction was left open", n)
		return
	}
	pool.Close()
}

// Dialect returns a dialect migrated through db into a fresh schema, which
// is dropped through pool after the test.
func Dialect(t testing.TB, db sqladapters.DB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Dialect {
	t.Helper()
	d := Fresh(t, pool, opts)
	dialecttest.Migrate(t, db, d)
	return d
}

// Fresh returns a dialect of a fresh schema, not migrated; the schema, if
// anything creates it, is dropped through pool after the test.
func Fresh(t testing.TB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Dialect {
	t.Helper()
	opts.Schema = dialecttest.UniqueName("t_")
	t.Cleanup(func() {
		// A transaction the test left open holds locks the drop would
		// wait for; the pool's cleanup reports the leak.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+opts.Schema+`" CASCADE`); err != nil && !strings.Contains(err.Error(), "closed pool") {
			t.Logf("drop schema %s: %v", opts.Schema, err)
		}
	})
	d, err := postgres.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// FreshFleet returns a fleet store in a fresh schema, not migrated; the
// schema, if anything creates it, is dropped through pool after the test.
func FreshFleet(t testing.TB, pool *pgxpool.Pool, opts postgres.FleetOptions) *postgres.Fleet {
	t.Helper()
	opts.Schema = dialecttest.UniqueName("f_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+opts.Schema+`" CASCADE`); err != nil && !strings.Contains(err.Error(), "closed pool") {
			t.Logf("drop schema %s: %v", opts.Schema, err)
		}
	})
	f, err := postgres.NewFleet(opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
