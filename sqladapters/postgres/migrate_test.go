package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestMigrateConcurrentFreshSchema starts a fleet for the first time: ten
// instances migrate at once into a schema that does not exist yet, through
// a pool whose every connection has already looked the schema up (it is in
// their search_path, and each dropped it if it existed). PostgreSQL caches
// such a lookup's miss per connection and a session waiting on an advisory
// lock does not refresh it, so every migrator after the first sees no
// schema and tries to create it again. Every one of them must succeed, in
// every round.
func TestMigrateConcurrentFreshSchema(t *testing.T) {
	const rounds, migrators = 20, 10
	admin := pgtest.Pool(t)
	ctx := dialecttest.Ctx(t, 4*time.Minute)
	for round := range rounds {
		schema := dialecttest.UniqueName("fleet_")
		t.Cleanup(func() {
			if _, err := admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
				t.Logf("drop schema %s: %v", schema, err)
			}
		})
		pool := lookedUp(t, ctx, schema, migrators)
		db := pgxv5.WrapPool(pool)
		d := postgres.MustNew(postgres.Options{Schema: schema})
		errs := make([]error, migrators)
		var wg sync.WaitGroup
		for i := range migrators {
			wg.Go(func() { errs[i] = sqladapters.Migrate(ctx, db, d) })
		}
		wg.Wait()
		pool.Close()
		var failed []error
		for i, err := range errs {
			if err != nil {
				failed = append(failed, fmt.Errorf("migrator %d: %w", i, err))
			}
		}
		if len(failed) > 0 {
			t.Errorf("round %d: %d of %d concurrent migrations failed: %v", round+1, len(failed), migrators, errors.Join(failed...))
		}
	}
}

// lookedUp returns a pool of n open connections that each looked schema
// up and found it missing, as the connections of instances starting after
// a DROP SCHEMA, or with the schema in their search_path, have.
func lookedUp(t *testing.T, ctx context.Context, schema string, n int) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = int32(n)
	cfg.ConnConfig.RuntimeParams["search_path"] = `"` + schema + `", public`
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			pool.Close()
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			pool.Close()
			t.Fatal(err)
		}
	}
	return pool
}
