package modernc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// Open a database file, create the millbox tables, and publish into the
// outbox in the same transaction as the application's own write.
func ExampleOpen() {
	dir, err := os.MkdirTemp("", "millbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	dialect := sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(db), dialect); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY)`); err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil) // BEGIN IMMEDIATE: holds the write lock
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id) VALUES ('o-1')`); err != nil {
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

	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+dialect.OutboxTable()).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("outbox rows:", n)
	// Output: outbox rows: 1
}
