// Quickstart runs millbox end to end and checks the result.
//
// Each order is a business row plus an "OrderPlaced" event written in one
// transaction (the outbox). A forwarder moves the committed events to a
// broker, and a Watermill router consumes them through the inbox
// middleware, which ships each order (applies its effect in the database)
// exactly once. To show that this holds, the demo stops the forwarder
// mid-run and starts a new one, and delivers some events a second time.
//
// With no flags it needs nothing installed: SQLite in a temporary directory
// and Kafka served in process by franz-go's kfake.
//
//	go run ./examples/quickstart
//	go run ./examples/quickstart -orders 2000 -postgres 'postgres://user@localhost:5432/app?sslmode=disable'
//	go run ./examples/quickstart -mysql 'user@tcp(localhost:3306)/app?parseTime=true' -amqp amqp://guest:guest@localhost:5672/
//	go run ./examples/quickstart -kafka broker1:9092,broker2:9092
//
// Tables, topic, queue and consumer group get a random suffix and are
// removed at the end. The last line is a summary a script can check; the
// exit status is non-zero unless lost=0:
//
//	orders=500 events_forwarded=500 handled_once=500 duplicates_skipped=50 lost=0
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// OrderPlaced is the event committed with each order.
type OrderPlaced struct {
	OrderID    string `json:"order_id"`
	Customer   string `json:"customer"`
	TotalCents int64  `json:"total_cents"`
}

type options struct {
	orders                       int
	postgres, mysql, kafka, amqp string
	timeout                      time.Duration
}

func main() {
	var o options
	flag.IntVar(&o.orders, "orders", 500, "number of orders to place")
	flag.StringVar(&o.postgres, "postgres", "", "PostgreSQL `URL` to use instead of SQLite, e.g. postgres://user@localhost:5432/app?sslmode=disable")
	flag.StringVar(&o.mysql, "mysql", "", "MySQL/MariaDB `DSN` to use instead of SQLite, e.g. user:pass@tcp(localhost:3306)/app?parseTime=true")
	flag.StringVar(&o.kafka, "kafka", "", "comma-separated Kafka `brokers` to use instead of the in-process Kafka")
	flag.StringVar(&o.amqp, "amqp", "", "RabbitMQ `URL` to use instead of Kafka, e.g. amqp://guest:guest@localhost:5672/")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up waiting for deliveries after this long")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), `Usage: quickstart [flags]

Places orders with an event each in one transaction (outbox), forwards the
events to a broker, and consumes them with the inbox middleware, stopping the
forwarder and delivering some events twice on the way. By default it uses
SQLite in a temporary directory and an in-process Kafka.

Flags:
`)
		flag.PrintDefaults()
	}
	flag.Parse()
	switch {
	case o.postgres != "" && o.mysql != "":
		fmt.Fprintln(os.Stderr, "quickstart: choose one of -postgres and -mysql")
		os.Exit(2)
	case o.kafka != "" && o.amqp != "":
		fmt.Fprintln(os.Stderr, "quickstart: choose one of -kafka and -amqp")
		os.Exit(2)
	case o.orders < 1:
		fmt.Fprintln(os.Stderr, "quickstart: -orders must be at least 1")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	start := time.Now()
	// Errors only: Watermill logs every subscription at info level.
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	suffix := fmt.Sprintf("%08x", rand.Uint32()) // keeps concurrent runs apart

	db, err := openDatabase(ctx, o, suffix)
	if err != nil {
		return err
	}
	defer db.cleanup()
	b, err := openBroker(o, suffix, logger)
	if err != nil {
		return err
	}
	defer b.close()
	fmt.Printf("%d orders: %s outbox -> forwarder -> %s -> router with the inbox middleware\n", o.orders, db.name, b.name)

	// The consumer: a router whose handler ships orders inside the
	// transaction the inbox middleware opens for each message.
	var duplicates atomic.Int64
	inbox, err := middleware.NewInbox(middleware.InboxConfig{
		DB:       stdsql.WrapDB(db.sql),
		Dialect:  db.dialect,
		Consumer: "shipping", // ids are recorded per consumer and router handler
		// Called for each delivery the inbox acked without running the handler.
		OnDuplicate: func(*message.Message) { duplicates.Add(1) },
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(
		// Each retry gets a fresh transaction: the failed one was rolled back.
		wmw.Retry{MaxRetries: 5, InitialInterval: 50 * time.Millisecond, Logger: logger}.Middleware,
		wmw.Recoverer,
		inbox, // last, so it runs closest to the handler
	)
	router.AddConsumerHandler("ship-order", b.topic, b.subscriber, shipOrder(db))
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer func() {
		_ = router.Close()
		if err := <-routerDone; err != nil {
			fmt.Fprintln(os.Stderr, "router:", err)
		}
	}()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router: %w", err)
	}

	// The forwarder's destination is the broker publisher, wrapped to
	// record which events the broker accepted.
	dest := &recordingPublisher{Publisher: b.publisher}
	stopForwarder, err := startForwarder(ctx, db, dest, logger)
	if err != nil {
		return err
	}
	defer func() { stopForwarder() }() // the one running at the end

	placed := 0
	status := func() {
		once, _, _ := db.shipped(ctx)
		fmt.Printf("  %5.2fs placed=%d forwarded=%d shipped=%d duplicates_skipped=%d\n",
			time.Since(start).Seconds(), placed, dest.count(), once, duplicates.Load())
	}
	for i := range o.orders {
		if i > 0 && i%max(o.orders/4, 1) == 0 {
			status()
		}
		if i == o.orders/2 {
			// Stop the forwarder mid-run, as a shutdown would, while
			// orders keep coming, and start a new one. Committed rows
			// wait in the outbox meanwhile: nothing is lost. (A forwarder
			// killed outright may also leave published rows behind,
			// which the next one publishes again: the re-published
			// events below play that part.)
			stopForwarder()
			fmt.Printf("forwarder #1 stopped after %d events while orders keep coming; starting forwarder #2\n", dest.count())
			if stopForwarder, err = startForwarder(ctx, db, dest, logger); err != nil {
				return err
			}
		}
		if err := placeOrder(ctx, db, b.topic, i); err != nil {
			return err
		}
		placed++
	}
	status()

	if err := waitFor(ctx, o.timeout, status, func() bool { return dest.count() >= o.orders }); err != nil {
		fmt.Printf("only %d of %d events were forwarded\n", dest.count(), o.orders)
	}
	// Deliver every tenth event a second time, straight to the broker with
	// the same UUID, as a producer retrying after a lost ack would.
	again := dest.everyNth(10)
	if err := b.publisher.Publish(b.topic, again...); err != nil {
		return fmt.Errorf("publish duplicates: %w", err)
	}
	fmt.Printf("published %d already delivered events again (same UUIDs); the inbox must skip them\n", len(again))

	_ = waitFor(ctx, o.timeout, status, func() bool {
		once, _, err := db.shipped(ctx)
		return err == nil && once == o.orders && duplicates.Load() >= int64(len(again))
	})
	status()
	stopForwarder()

	once, lost, err := db.shipped(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("done in %v\n", time.Since(start).Round(10*time.Millisecond))
	// events_forwarded: distinct events whose publish to the broker by a
	// forwarder succeeded (the re-published copies are not counted).
	// handled_once: orders shipped exactly once. duplicates_skipped:
	// deliveries the inbox acked without running the handler. lost: orders
	// not shipped exactly once.
	fmt.Printf("orders=%d events_forwarded=%d handled_once=%d duplicates_skipped=%d lost=%d\n",
		o.orders, dest.count(), once, duplicates.Load(), lost)
	if lost != 0 {
		return fmt.Errorf("%d orders were not shipped exactly once", lost)
	}
	return nil
}

// placeOrder writes an order and its OrderPlaced event in one transaction:
// both commit or neither does.
func placeOrder(ctx context.Context, db *database, topic string, i int) error {
	ev := OrderPlaced{
		OrderID:    fmt.Sprintf("order-%05d", i),
		Customer:   fmt.Sprintf("customer-%02d", i%20),
		TotalCents: int64(1000 + i),
	}
	tx, err := db.sql.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // does nothing after Commit
	_, err = tx.ExecContext(ctx, db.q(`INSERT INTO `+db.orders+` (id, customer, total_cents) VALUES (?, ?, ?)`),
		ev.OrderID, ev.Customer, ev.TotalCents)
	if err != nil {
		return fmt.Errorf("insert order: %w", err)
	}

	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	// The ordering key: events of one customer are forwarded in commit
	// order, and become Kafka records with this key (one partition).
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, ev.Customer)
	outbox, err := forwarder.NewPublisher(stdsql.WrapTx(tx), forwarder.PublisherConfig{Dialect: db.dialect})
	if err != nil {
		return err
	}
	if err := outbox.Publish(topic, msg); err != nil {
		return err
	}
	return tx.Commit()
}

// shipOrder is the consumer's business logic. It runs in the transaction
// the inbox middleware began, which already holds this message's inbox
// row: the shipment and the row commit together, so a redelivered event
// finds the row and is skipped.
func shipOrder(db *database) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		var ev OrderPlaced
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return err
		}
		tx, err := stdsql.TxFromContext(msg.Context())
		if err != nil {
			return err
		}
		res, err := tx.ExecContext(msg.Context(),
			db.q(`UPDATE `+db.orders+` SET times_shipped = times_shipped + 1 WHERE id = ?`), ev.OrderID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("ship %s: %d rows updated (%v)", ev.OrderID, n, err)
		}
		return nil
	}
}

// startForwarder starts a forwarder from the outbox to dest. The returned
// stop closes it: rows being published finish, and the partitions are
// released for the next forwarder.
func startForwarder(ctx context.Context, db *database, dest message.Publisher, logger watermill.LoggerAdapter) (stop func(), err error) {
	fw, err := forwarder.New(forwarder.Config{
		DB:          stdsql.WrapDB(db.sql),
		Dialect:     db.dialect,
		Destination: dest,
		Logger:      logger,
	})
	if err != nil {
		return nil, err
	}
	return exampleenv.StartForwarder(ctx, fw)
}
