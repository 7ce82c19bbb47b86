package wmsql_test

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// An application that already holds watermill-sql's transactions (here
// one begun through its Beginner) publishes into the outbox in them.
func ExampleWrapTx() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	dialect := postgres.MustNew(postgres.Options{})

	tx, err := wsql.BeginnerFromStdSQL(db).BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `UPDATE stock SET reserved = reserved + 1 WHERE sku = $1`, "sku-1"); err != nil {
		panic(err)
	}
	// A publisher bound to the transaction, as watermill-sql's own
	// publisher is: a message.Publisher for code that takes one.
	outbox, err := forwarder.NewPublisher(wmsql.WrapTx(tx), forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		panic(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"sku":"sku-1"}`))
	if err := outbox.Publish("stock", msg); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
}
