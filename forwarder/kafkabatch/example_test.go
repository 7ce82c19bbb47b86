package kafkabatch_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The forwarder sending each key's messages to Kafka in one round trip.
// examples/cdc in the repository runs it against a Kafka served in process;
// examples/postgres-kafka uses watermill-kafka's publisher instead.
func ExampleNewPublisher() {
	ctx := context.Background()
	// database/sql with the pgx stdlib driver (or pgxv5.WrapPool of a pgx pool).
	sqlDB, err := sql.Open("pgx", "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()

	// The ordering key stored with each row becomes the record key: a key
	// stays on one partition, in order.
	destination, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"localhost:9092"}})
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
