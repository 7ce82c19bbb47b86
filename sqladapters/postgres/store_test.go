package postgres_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "github.com/lib/pq"              // registers the "postgres" database/sql driver

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/internal/storetest"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// TestStore runs the store contract's suite on PostgreSQL through every
// adapter: pgx (whose BeginExec records an inbox message in one round
// trip), on the plain and the partitioned layout, both with the inserts
// that flush statistics (Options.FlushStats); database/sql with pgx's
// driver and with lib/pq; and the watermill-sql wrappers that are not
// unwrapped to pgx or database/sql.
func TestStore(t *testing.T) {
	fresh := func(pool *pgxpool.Pool, opts postgres.Options) func(*testing.T) sqladapters.Dialect {
		return func(t *testing.T) sqladapters.Dialect { return pgtest.Fresh(t, pool, opts) }
	}
	t.Run("pgx", func(t *testing.T) {
		pool := pgtest.Pool(t)
		storetest.Run(t, storetest.Setup{
			DB:    pgxv5.WrapPool(pool),
			New:   fresh(pool, postgres.Options{Notify: true, FlushStats: true}),
			InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		})
	})
	t.Run("pgx/partitioned", func(t *testing.T) {
		pool := pgtest.Pool(t)
		storetest.Run(t, storetest.Setup{
			DB:    pgxv5.WrapPool(pool),
			New:   fresh(pool, postgres.Options{Partitioned: &postgres.PartitionOptions{}, FlushStats: true}),
			InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		})
	})
	t.Run("stdsql", func(t *testing.T) {
		pool := pgtest.Pool(t)
		db := openStd(t, "pgx")
		storetest.Run(t, storetest.Setup{
			DB:    stdsql.WrapDB(db),
			New:   fresh(pool, postgres.Options{}),
			InUse: func() int { return db.Stats().InUse },
		})
	})
	t.Run("stdsql/pq", func(t *testing.T) {
		pool := pgtest.Pool(t)
		db := openStd(t, "postgres")
		storetest.Run(t, storetest.Setup{
			DB:    stdsql.WrapDB(db),
			New:   fresh(pool, postgres.Options{Notify: true}),
			InUse: func() int { return db.Stats().InUse },
		})
	})
	t.Run("wmsql/pgx", func(t *testing.T) {
		pool := pgtest.Pool(t)
		db := wmsql.WrapBeginner(wsql.BeginnerFromPgx(pgxConn{pool}))
		if _, ok := db.(*pgxv5.DB); ok {
			t.Fatal("the wrapper was unwrapped to pgx")
		}
		storetest.Run(t, storetest.Setup{
			DB:    db,
			New:   fresh(pool, postgres.Options{}),
			InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		})
	})
	t.Run("wmsql/stdsql", func(t *testing.T) {
		pool := pgtest.Pool(t)
		std := openStd(t, "pgx")
		db := wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(stdBeginner{std}))
		if _, ok := db.(*stdsql.DB); ok {
			t.Fatal("the wrapper was unwrapped to database/sql")
		}
		storetest.Run(t, storetest.Setup{
			DB:    db,
			New:   fresh(pool, postgres.Options{Notify: true}),
			InUse: func() int { return std.Stats().InUse },
		})
	})
}

// TestFleetStore runs the fleet store's suite on PostgreSQL through every
// adapter the store suite runs on.
func TestFleetStore(t *testing.T) {
	fresh := func(pool *pgxpool.Pool) func(*testing.T) sqladapters.FleetStore {
		return func(t *testing.T) sqladapters.FleetStore { return pgtest.FreshFleet(t, pool, postgres.FleetOptions{}) }
	}
	t.Run("pgx", func(t *testing.T) {
		pool := pgtest.Pool(t)
		storetest.RunFleet(t, storetest.FleetSetup{
			DB:    pgxv5.WrapPool(pool),
			New:   fresh(pool),
			InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		})
	})
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run("stdsql/"+driver, func(t *testing.T) {
			pool := pgtest.Pool(t)
			db := openStd(t, driver)
			storetest.RunFleet(t, storetest.FleetSetup{
				DB:    stdsql.WrapDB(db),
				New:   fresh(pool),
				InUse: func() int { return db.Stats().InUse },
			})
		})
	}
	t.Run("wmsql/pgx", func(t *testing.T) {
		pool := pgtest.Pool(t)
		storetest.RunFleet(t, storetest.FleetSetup{
			DB:    wmsql.WrapBeginner(wsql.BeginnerFromPgx(pgxConn{pool})),
			New:   fresh(pool),
			InUse: func() int { return int(pool.Stat().AcquiredConns()) },
		})
	})
	t.Run("wmsql/stdsql", func(t *testing.T) {
		pool := pgtest.Pool(t)
		std := openStd(t, "pgx")
		storetest.RunFleet(t, storetest.FleetSetup{
			DB:    wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(stdBeginner{std})),
			New:   fresh(pool),
			InUse: func() int { return std.Stats().InUse },
		})
	})
}

// openStd opens the test server through database/sql with driver: "pgx"
// or lib/pq's "postgres".
func openStd(t *testing.T, driver string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, pgtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		dialecttest.Unavailable(t, "PostgreSQL", pgtest.URLVariable, err)
	}
	return db
}

// pgxConn and stdBeginner hide the pool from wmsql, which would otherwise
// run it through pgxv5 or stdsql directly.
type (
	pgxConn     struct{ *pgxpool.Pool }
	stdBeginner struct{ *sql.DB }
)

// TestPendingHorizonRefusesCachedSequence checks that a horizon is refused
// where sessions draw ids from blocks of their own (a sequence with CACHE
// above 1): an id below the sequence's position could still be drawn, and
// a forwarder must then read from the first row.
func TestPendingHorizonRefusesCachedSequence(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	ctx := dialecttest.Ctx(t, time.Minute)
	if _, err := d.PendingHorizon(ctx, db); err != nil {
		t.Fatalf("PendingHorizon: %v", err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE `+d.OutboxTable()+` ALTER COLUMN id SET CACHE 10`); err != nil {
		t.Fatal(err)
	}
	_, err := d.PendingHorizon(ctx, db)
	if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "CACHE 10") {
		t.Fatalf("PendingHorizon with CACHE 10: %v, want errors.ErrUnsupported naming the cache", err)
	}
}
