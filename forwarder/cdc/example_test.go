package cdc_test

import (
	"context"
	"log"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The forwarder reading the outbox from logical replication instead of
// polling it. The server needs wal_level = logical and the role
// REPLICATION; examples/cdc in the repository runs two instances, one
// streaming and one standing by.
func Example() {
	ctx := context.Background()
	url := "postgres://app@localhost:5432/app"
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db, dialect := pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}
	src := cdc.Source{ConnString: url, Slot: "orders_outbox", Publication: "orders_outbox"}
	if err := cdc.Setup(ctx, db, dialect, src); err != nil { // once; or src.CreateIfMissing
		log.Fatal(err)
	}

	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}), // Kafka, RabbitMQ, ...
		Source:      src,
	})
	if err != nil {
		log.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fw.Run(ctx) }()
	if err := fw.Ready(ctx); err != nil {
		log.Fatal(err) // wal_level, REPLICATION, a missing table, publication or slot
	}
	defer func() { fw.Close(); <-runErr }()

	// ... the application runs ...
}
