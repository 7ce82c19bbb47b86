package stdsql_test

import (
	"context"
	"database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// An order and its event, written in one database/sql transaction: the
// event commits with the order, or neither does.
func ExampleWrapTx() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		panic(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // after Commit, a no-op
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES ($1, $2)`, 42, 1999); err != nil {
		panic(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7")
	if err := outbox.PublishTx(ctx, stdsql.WrapTx(tx), "orders", msg); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
}
