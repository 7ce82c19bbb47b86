package pgxv5_test

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// A forwarder behind PgBouncer in transaction pooling: the pool runs
// statements without prepared statements kept across transactions, and the
// notification listener gets a direct connection of its own.
func ExampleListenOn() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@pgbouncer:6432/app?default_query_exec_mode=exec")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	db := pgxv5.WrapPool(pool, pgxv5.ListenOn("postgres://app@postgres:5432/app"))

	f, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     postgres.MustNew(postgres.Options{Notify: true}),
		Destination: gochannel.NewGoChannel(gochannel.Config{}, nil), // Kafka, RabbitMQ, ...
	})
	if err != nil {
		panic(err)
	}
	_ = f.Run(ctx)
}
