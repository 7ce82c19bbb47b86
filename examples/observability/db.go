package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// database holds the millbox tables.
type database struct {
	name      string
	wrapped   sqladapters.DB
	dialect   sqladapters.Dialect
	txOptions sql.TxOptions
	cleanup   func()
}

// openDatabase opens SQLite in a temporary directory, or PostgreSQL with
// the tables in a schema of this run, and migrates it.
func openDatabase(ctx context.Context, kind, suffix string) (*database, error) {
	var db *database
	switch kind {
	case "postgres":
		pool, err := pgxpool.New(ctx, exampleenv.PostgresURL())
		if err != nil {
			return nil, err
		}
		schema := "millbox_observability_" + suffix
		d, err := postgres.New(postgres.Options{Schema: schema})
		if err != nil {
			pool.Close()
			return nil, err
		}
		db = &database{name: "PostgreSQL", wrapped: pgxv5.WrapPool(pool), dialect: d, cleanup: func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
				fmt.Fprintln(os.Stderr, "cleanup:", err)
			}
			pool.Close()
		}}
	default:
		dir, err := os.MkdirTemp("", "millbox-observability-")
		if err != nil {
			return nil, err
		}
		sqlDB, err := modernc.Open(filepath.Join(dir, "observability.db"), modernc.Config{})
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		db = &database{name: "SQLite", wrapped: stdsql.WrapDB(sqlDB), dialect: sqlite.MustNew(sqlite.Options{}), cleanup: func() {
			sqlDB.Close()
			os.RemoveAll(dir)
		}}
	}
	if err := sqladapters.Migrate(ctx, db.wrapped, db.dialect); err != nil {
		db.cleanup()
		return nil, fmt.Errorf("migrate %s: %w", db.name, err)
	}
	return db, nil
}
