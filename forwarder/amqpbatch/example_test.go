package amqpbatch_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The forwarder sending to RabbitMQ with publisher confirms, a key's
// messages confirmed together. examples/postgres-rabbitmq in the repository
// runs the forwarder against RabbitMQ with watermill-amqp's publisher.
func ExampleNewPublisher() {
	ctx := context.Background()
	// database/sql with the pgx stdlib driver (or pgxv5.WrapPool of a pgx pool).
	sqlDB, err := sql.Open("pgx", "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()

	// A call's messages on one confirm-mode channel, confirmed together;
	// the queue is the topic (declare it, or start its consumer, first).
	destination, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: "amqp://guest:guest@localhost:5672/"})
	if err != nil {
		log.Fatal(err)
	}
	defer destination.Close()

	fw, err := forwarder.New(forwarder.Config{
		DB:          stdsql.WrapDB(sqlDB),
		Dialect:     postgres.MustNew(postgres.Options{}),
		Destination: destination,
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := fw.Run(ctx); err != nil { // until ctx ends or fw.Close
		log.Fatal(err)
	}
}
