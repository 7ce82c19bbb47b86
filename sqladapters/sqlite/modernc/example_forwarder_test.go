package modernc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// forwarder.New, the whole outbox on SQLite: events committed in a
// transaction, forwarded to a destination (here an in-memory Watermill
// pub/sub; Kafka or RabbitMQ publishers plug in the same way), one key's
// events in order.
func Example_forwarder() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "millbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqlDB, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	db, dialect := stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}

	// GoChannel keeps a publisher's order only when Publish waits for the
	// subscriber's ack; a broker keeps it per partition or queue.
	destination := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	defer destination.Close()
	received, err := destination.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	fwd, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: destination})
	if err != nil {
		log.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(ctx) }()
	if err := fwd.Ready(ctx); err != nil {
		log.Fatal(err)
	}
	defer func() { fwd.Close(); <-runErr }()

	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	var events []*message.Message
	for _, e := range []string{"placed", "paid", "shipped"} {
		msg := message.NewMessage("order-7-"+e, []byte(e))
		msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "order-7")
		events = append(events, msg)
	}
	if err := outbox.PublishTx(ctx, stdsql.WrapTx(tx), "orders", events...); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	for range events {
		msg := <-received
		fmt.Println(msg.UUID, msg.Metadata.Get(forwarder.DefaultKeyMetadataField))
		msg.Ack()
	}
	// Output:
	// order-7-placed order-7
	// order-7-paid order-7
	// order-7-shipped order-7
}
