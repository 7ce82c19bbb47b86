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

// forwarder.NewContextPublisher on SQLite: one publisher made at start
// publishes in any transaction with one call. OrderingKey derives each
// message's ordering key, here from metadata a producer such as a
// cqrs.EventBus sets; it runs on SQLite so the example runs anywhere.
func Example_publishTx() {
	ctx := context.Background()
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
	dialect := sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(db), dialect); err != nil {
		log.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (id TEXT PRIMARY KEY, total INTEGER)`); err != nil {
		log.Fatal(err)
	}

	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{
		Dialect: dialect,
		OrderingKey: func(topic string, msg *message.Message) string {
			return msg.Metadata.Get("order_id")
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, total) VALUES ('order-7', 42)`); err != nil {
		log.Fatal(err)
	}
	msg := message.NewMessage("evt-1", []byte(`{"total":42}`))
	msg.Metadata.Set("order_id", "order-7")
	if err := outbox.PublishTx(ctx, stdsql.WrapTx(tx), "orders", msg); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	var topic, uuid, key string
	if err := db.QueryRowContext(ctx, `SELECT topic, uuid, key FROM millbox_outbox`).Scan(&topic, &uuid, &key); err != nil {
		log.Fatal(err)
	}
	fmt.Println(topic, uuid, key)
	// Output: orders evt-1 order-7
}
