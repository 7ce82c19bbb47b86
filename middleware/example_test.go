package middleware_test

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// A consumer whose handler writes in the inbox transaction and publishes a
// follow-up event through the outbox, atomically.
func ExampleNewInbox() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://localhost/app")
	dialect, _ := postgres.New(postgres.Options{})
	var subscriber message.Subscriber // Kafka, RabbitMQ, ...
	var poisonPublisher message.Publisher

	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{
		DB:       pgxv5.WrapPool(pool),
		Dialect:  dialect,
		Consumer: "billing",
	})
	if err != nil {
		panic(err)
	}
	outbox, _ := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	poison, _ := wmw.PoisonQueue(poisonPublisher, "billing.poison")

	router, _ := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	router.AddMiddleware(
		poison,
		wmw.Retry{MaxRetries: 3, InitialInterval: 100 * time.Millisecond}.Middleware,
		wmw.Recoverer,
		inboxMW, // last: closest to the handler
	)
	router.AddConsumerHandler("invoice", "orders", subscriber, func(msg *message.Message) error {
		tx, err := pgxv5.TxFromContext(msg.Context())
		if err != nil {
			return err
		}
		if _, err := tx.Exec(msg.Context(), `INSERT INTO invoices (order_uuid) VALUES ($1)`, msg.UUID); err != nil {
			return err
		}
		ev := message.NewMessage(watermill.NewUUID(), []byte(`{"invoiced":true}`))
		ev.SetContext(msg.Context()) // the same transaction
		return outbox.Publish("invoices", ev)
	})
	_ = router.Run(ctx)
}
