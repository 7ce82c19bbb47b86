package sqladapters_test

import (
	"context"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Create or upgrade the millbox tables at start, from every instance: a
// lock serializes migrators and applied versions are skipped.
// Example_migrate of package sqladapters/sqlite/modernc runs this on
// SQLite.
func ExampleMigrate() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{Schema: "app"})
	if err != nil {
		log.Fatal(err)
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), dialect); err != nil {
		log.Fatal(err) // a *sqladapters.MissingTableError later says to run this
	}
}

// Create the millbox tables together with the application's own schema
// change, in one transaction (PostgreSQL and SQLite; MySQL commits DDL
// implicitly and is refused).
func ExampleMigrateTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}
	if err := sqladapters.MigrateTx(ctx, pgxv5.WrapTx(tx), postgres.MustNew(postgres.Options{})); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// Write the schema as a script for a migration tool (goose, atlas,
// flyway) instead of running Migrate; `millbox migrate sql --db postgres`
// prints the same.
func ExampleMigrationSQL() {
	script := sqladapters.MigrationSQL(postgres.MustNew(postgres.Options{Schema: "app"}))
	if err := os.WriteFile("migrations/0001_millbox.sql", []byte(script), 0o644); err != nil {
		log.Fatal(err)
	}
}
