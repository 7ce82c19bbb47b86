package forwarder_test

import (
	"context"
	"log"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Write an order and its event in one pgx transaction: both commit or
// neither does.
func ExampleNewPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, "order-1"); err != nil {
		log.Fatal(err)
	}
	pub, err := forwarder.NewPublisher(pgxv5.WrapTx(tx), forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":"order-1"}`))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7") // ordering key
	if err := pub.Publish("orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// One long-lived publisher for the whole application (for example behind a
// cqrs.EventBus): each message carries its transaction in its context.
func ExampleNewContextPublisher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":"order-1"}`))
	msg.SetContext(sqladapters.WithTx(ctx, pgxv5.WrapTx(tx)))
	if err := outbox.Publish("orders", msg); err != nil {
		log.Fatal(err) // without a transaction in the context: forwarder.ErrNoTx
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}

// Forward the outbox to any Watermill publisher: Kafka, RabbitMQ, or here
// an in-memory GoChannel.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	dialect, err := postgres.New(postgres.Options{})
	if err != nil {
		log.Fatal(err)
	}
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}
	destination := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})

	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: destination,
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx) }()
	if err := fw.Ready(ctx); err != nil {
		log.Fatal(err) // unreachable database, missing tables, ...
	}

	// ... the application runs ...

	if err := fw.Close(); err != nil { // graceful: in-flight rows finish
		log.Print(err)
	}
	if err := <-done; err != nil {
		log.Print(err)
	}
}

// Send a reminder a day after the order, and an event through Watermill's
// delay component a minute after it: both wait in the outbox's table of
// scheduled messages, written in the order's transaction, and the
// forwarder sends them when they are due.
func ExampleDeliverAfter() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	reminder := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"order-1"}`))
	reminder.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7")
	forwarder.DeliverAfter(reminder, 24*time.Hour)
	followUp := message.NewMessage(watermill.NewUUID(), []byte(`{"order":"order-1"}`))
	delay.Message(followUp, delay.For(time.Minute))
	if err := outbox.PublishTx(ctx, pgxv5.WrapTx(tx), "reminders", reminder, followUp); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
}
