package postgres_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The dialect of one millbox installation: its schema and table names.
// Publishers, forwarders, the inbox and the operations of one outbox use
// the same options.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{Schema: "messaging"})
	if err != nil {
		log.Fatal(err) // a schema or table name that is not a plain identifier
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), dialect); err != nil {
		log.Fatal(err)
	}
}

// The time-partitioned outbox: one partition per day, dropped a week after
// its day once it holds no pending or dead row. Forwarders on this dialect
// run the maintenance.
func ExampleNew_partitioned() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{Partitioned: &postgres.PartitionOptions{}})
	if err != nil {
		log.Fatal(err)
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), dialect); err != nil {
		log.Fatal(err)
	}
}
