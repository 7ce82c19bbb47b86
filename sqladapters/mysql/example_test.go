package mysql_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// Connect, create the millbox tables, and publish into the outbox in the
// same transaction as the application's own write.
func ExampleNew() {
	db, err := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app?parseTime=true&interpolateParams=true")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	skipLocked, err := mysql.DetectSkipLocked(ctx, stdsql.WrapDB(db))
	if err != nil {
		log.Fatal(err)
	}
	dialect, err := mysql.New(mysql.Options{SkipLocked: skipLocked})
	if err != nil {
		log.Fatal(err)
	}
	// Not MigrateTx: MySQL would commit the surrounding transaction.
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(db), dialect); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES (?)`, "o-1"); err != nil {
		log.Fatal(err)
	}
	pub, err := forwarder.NewPublisher(stdsql.WrapTx(tx), forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		log.Fatal(err)
	}
	if err := pub.Publish("orders.created", message.NewMessage("o-1", []byte(`{"id":"o-1"}`))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}
