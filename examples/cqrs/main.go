// Cqrs wires millbox into Watermill's CQRS component: a cqrs.EventBus
// publishes into the outbox, in whatever transaction the context carries,
// and a cqrs.EventProcessor runs its handlers under the inbox middleware.
//
// Placing an order commits the order row and an OrderPlaced event together.
// Two handlers react to OrderPlaced: reserve-stock, which records a
// reservation and publishes StockReserved from inside its own transaction,
// and send-confirmation, which records an e-mail to send. A third handler,
// mark-ready, reacts to StockReserved. Every tenth OrderPlaced reaches
// Kafka twice; each handler keeps its own inbox keys, so both skip it.
//
//	go run ./examples/cqrs
//	go run ./examples/cqrs -n 2000 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable. Kafka runs in process
// (franz-go's kfake) unless -kafka names brokers. Schema, topics and
// consumer groups are named per run and removed at the end. The last line is
// a summary such as:
//
//	orders=200 reserved=200 confirmations=200 ready=200 duplicates_skipped=40 ok=true
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// OrderPlaced is published with each new order.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	Items   int    `json:"items"`
}

// StockReserved is published by the reserve-stock handler.
type StockReserved struct {
	OrderID string `json:"order_id"`
}

// orderKey is the ordering key of every event of this service: the order
// id in its JSON payload, so that an order's events are forwarded in order.
func orderKey(_ string, msg *message.Message) string {
	var e struct {
		OrderID string `json:"order_id"`
	}
	_ = json.Unmarshal(msg.Payload, &e) // no order id: not ordered
	return e.OrderID
}

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	brokers := flag.String("kafka", "", "comma-separated Kafka `brokers` (default: an in-process Kafka)")
	n := flag.Int("n", 200, "number of orders")
	flag.Parse()
	if err := run(*pgURL, *brokers, *n); err != nil {
		fmt.Fprintln(os.Stderr, "cqrs:", err)
		os.Exit(1)
	}
}

func run(pgURL, brokers string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_cqrs_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	table := func(name string) string { return `"` + schema + `".` + name }
	for _, ddl := range []string{
		`CREATE TABLE ` + table("orders") + ` (id text PRIMARY KEY, items int NOT NULL, status text NOT NULL DEFAULT 'placed')`,
		`CREATE TABLE ` + table("reservations") + ` (order_id text PRIMARY KEY)`,
		`CREATE TABLE ` + table("emails") + ` (order_id text PRIMARY KEY)`,
	} {
		if _, err := pool.Exec(ctx, ddl); err != nil {
			return err
		}
	}

	// Kafka: topics and consumer groups carry the run's suffix.
	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	var topics, groups []string
	defer func() { stopKafka(topics, groups) }() // after the clients below closed
	marshalKey := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return destination.Key(msg), nil
	})
	kafkaPub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: marshalKey}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer kafkaPub.Close()
	topicOf := func(eventName string) string { return "cqrs_" + suffix + "." + eventName }

	// The event bus publishes into the outbox: the context passed to
	// Publish must carry a transaction (sqladapters.WithTx, or a handler's
	// context under the inbox middleware).
	marshaler := cqrs.JSONMarshaler{GenerateName: cqrs.StructName}
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect, OrderingKey: orderKey})
	if err != nil {
		return err
	}
	eventBus, err := cqrs.NewEventBusWithConfig(outbox, cqrs.EventBusConfig{
		GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) {
			return topicOf(p.EventName), nil
		},
		Marshaler: marshaler,
	})
	if err != nil {
		return err
	}

	// The event processor's handlers run in the router, under the inbox.
	var duplicates atomic.Int64
	inbox, err := middleware.NewInbox(middleware.InboxConfig{
		DB: db, Dialect: dialect,
		// Ids are kept per handler ("shop/reserve-stock", ...): each
		// handler processes each event once.
		Consumer:    "shop",
		OnDuplicate: func(*message.Message) { duplicates.Add(1) },
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(wmw.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond}.Middleware, wmw.Recoverer, inbox)
	processor, err := cqrs.NewEventProcessorWithConfig(router, cqrs.EventProcessorConfig{
		GenerateSubscribeTopic: func(p cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) {
			return topicOf(p.EventName), nil
		},
		// A consumer group per handler, so every handler gets every event.
		SubscriberConstructor: func(p cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) {
			topic, group := topicOf(p.EventName), p.HandlerName+"-"+suffix
			topics, groups = append(topics, topic), append(groups, group)
			return exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
				Brokers: addrs, ConsumerGroup: group, Topics: []string{topic},
			})
		},
		Marshaler: marshaler,
	})
	if err != nil {
		return err
	}
	exec := func(ctx context.Context, sql string, args ...any) error {
		tx, err := pgxv5.TxFromContext(ctx) // the inbox middleware's transaction
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sql, args...)
		return err
	}
	err = processor.AddHandlers(
		cqrs.NewEventHandler("reserve-stock", func(ctx context.Context, e *OrderPlaced) error {
			if err := exec(ctx, `INSERT INTO `+table("reservations")+` (order_id) VALUES ($1)`, e.OrderID); err != nil {
				return err
			}
			// ctx carries the handler's transaction: StockReserved goes
			// into the outbox atomically with the reservation and the
			// inbox row.
			return eventBus.Publish(ctx, &StockReserved{OrderID: e.OrderID})
		}),
		cqrs.NewEventHandler("send-confirmation", func(ctx context.Context, e *OrderPlaced) error {
			return exec(ctx, `INSERT INTO `+table("emails")+` (order_id) VALUES ($1)`, e.OrderID)
		}),
		cqrs.NewEventHandler("mark-ready", func(ctx context.Context, e *StockReserved) error {
			return exec(ctx, `UPDATE `+table("orders")+` SET status = 'ready' WHERE id = $1`, e.OrderID)
		}),
	)
	if err != nil {
		return err
	}
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()
	<-router.Running()

	// The forwarder: outbox -> Kafka, through a publisher that sends
	// every tenth OrderPlaced twice.
	dest := &duplicatingPublisher{Publisher: kafkaPub, name: marshaler.Name(&OrderPlaced{})}
	fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: dest})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	// Place the orders: each order row and its event in one transaction.
	for i := range n {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		e := &OrderPlaced{OrderID: fmt.Sprintf("order-%05d", i), Items: 1 + i%3}
		_, err = tx.Exec(ctx, `INSERT INTO `+table("orders")+` (id, items) VALUES ($1, $2)`, e.OrderID, e.Items)
		if err == nil {
			err = eventBus.Publish(sqladapters.WithTx(ctx, pgxv5.WrapTx(tx)), e)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
	}

	count := func(query string) int {
		var c int
		_ = pool.QueryRow(ctx, query).Scan(&c)
		return c
	}
	var reserved, emails, ready int
	ok := false
	for !ok && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
		reserved = count(`SELECT count(*) FROM ` + table("reservations"))
		emails = count(`SELECT count(*) FROM ` + table("emails"))
		ready = count(`SELECT count(*) FROM ` + table("orders") + ` WHERE status = 'ready'`)
		// Each duplicate OrderPlaced is skipped by both of its handlers.
		ok = reserved == n && emails == n && ready == n && duplicates.Load() >= 2*dest.sentTwice.Load()
	}
	fmt.Printf("%d OrderPlaced events were delivered twice\n", dest.sentTwice.Load())
	fmt.Printf("orders=%d reserved=%d confirmations=%d ready=%d duplicates_skipped=%d ok=%t\n",
		n, reserved, emails, ready, duplicates.Load(), ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}
