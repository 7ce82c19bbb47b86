package redisbatch_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/redisbatch"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The forwarder adding each key's messages to a Redis stream in one round
// trip. examples/postgres-redis in the repository runs it with a stream
// per group of keys and watermill-redisstream's subscriber.
func ExampleNewPublisher() {
	ctx := context.Background()
	// database/sql with the pgx stdlib driver (or pgxv5.WrapPool of a pgx pool).
	sqlDB, err := sql.Open("pgx", "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()

	// A call's messages added to the stream in one MULTI/EXEC; the
	// stream is the topic.
	destination, err := redisbatch.NewPublisher(redisbatch.Config{Client: redis.NewClient(&redis.Options{Addr: "localhost:6379"})})
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
