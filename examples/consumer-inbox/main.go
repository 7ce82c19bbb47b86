// Consumer-inbox is a consumer service built on the inbox middleware. A
// billing service consumes PaymentReceived events from Kafka and, for each,
// records an invoice and publishes an InvoiceIssued event through the
// outbox. The inbox row, the invoice and the outbox row share the handler's
// transaction: consume, process and produce commit together or not at all.
//
// The demo's upstream producer sends some payments twice with the same
// UUID, as a producer retrying after a lost ack does, and the handler fails
// the first attempt of some payments after it has written everything. The
// inbox skips the duplicates, the failed attempts leave nothing behind, and
// each payment yields exactly one invoice and one InvoiceIssued event.
//
//	go run ./examples/consumer-inbox
//	go run ./examples/consumer-inbox -n 5000 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable. Kafka runs in process
// (franz-go's kfake) unless -kafka names brokers. Schema, topics and
// consumer groups are named per run and removed at the end.
// The last line is a summary such as:
//
//	payments=300 duplicates_skipped=30 failed_attempts=30 invoices=300 invoice_events=300 ok=true
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
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

// PaymentReceived is the event the billing service consumes.
type PaymentReceived struct {
	PaymentID string `json:"payment_id"`
	Customer  string `json:"customer"`
	Cents     int64  `json:"cents"`
}

// InvoiceIssued is the event it produces for each payment.
type InvoiceIssued struct {
	PaymentID string `json:"payment_id"`
	Cents     int64  `json:"cents"`
}

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	brokers := flag.String("kafka", "", "comma-separated Kafka `brokers` (default: an in-process Kafka)")
	n := flag.Int("n", 300, "number of payments")
	flag.Parse()
	if err := run(*pgURL, *brokers, *n); err != nil {
		fmt.Fprintln(os.Stderr, "consumer-inbox:", err)
		os.Exit(1)
	}
}

func run(pgURL, brokers string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	// The service's database: its own tables plus millbox's inbox and outbox.
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_inbox_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	invoices := `"` + schema + `".invoices`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+invoices+` (payment_id text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		return err
	}

	// Kafka: topics and consumer groups carry the run's suffix.
	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	payments, invoiceEvents := "payments."+suffix, "invoices."+suffix
	group := "billing-" + suffix
	defer stopKafka([]string{payments, invoiceEvents}, []string{group}) // after the clients below closed
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return destination.Key(msg), nil
	})
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: marshaler}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()

	// The forwarder sends the service's outbox to Kafka.
	var forwarded atomic.Int64
	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: pub,
		Hooks:       forwarder.Hooks{OnBatch: func(s forwarder.BatchStats) { forwarded.Add(int64(s.Forwarded)) }},
	})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	// The consumer.
	var duplicates, failures atomic.Int64
	inbox, err := middleware.NewInbox(middleware.InboxConfig{
		DB: db, Dialect: dialect, Consumer: "billing",
		OnDuplicate: func(*message.Message) { duplicates.Add(1) },
	})
	if err != nil {
		return err
	}
	// One long-lived outbox publisher; it finds the handler's transaction
	// in the context of the messages it is given.
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	router.AddMiddleware(
		wmw.Retry{MaxRetries: 3, InitialInterval: 10 * time.Millisecond}.Middleware, // each attempt: a new transaction
		wmw.Recoverer,
		inbox, // last: closest to the handler
	)
	// The subscriber also creates the topic the service produces to.
	paymentsSub, err := exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
		Brokers: addrs, ConsumerGroup: group, Topics: []string{payments, invoiceEvents},
	})
	if err != nil {
		return err
	}
	var attempted sync.Map // payments whose first attempt failed on purpose
	router.AddConsumerHandler("issue-invoice", payments, paymentsSub, func(msg *message.Message) error {
		var p PaymentReceived
		if err := json.Unmarshal(msg.Payload, &p); err != nil {
			return err
		}
		tx, err := pgxv5.TxFromContext(msg.Context()) // the inbox middleware's transaction
		if err != nil {
			return err
		}
		if _, err := tx.Exec(msg.Context(), `INSERT INTO `+invoices+` (payment_id, cents) VALUES ($1, $2)`, p.PaymentID, p.Cents); err != nil {
			return err
		}
		payload, _ := json.Marshal(InvoiceIssued{PaymentID: p.PaymentID, Cents: p.Cents})
		ev := message.NewMessage(watermill.NewUUID(), payload)
		ev.Metadata.Set(forwarder.DefaultKeyMetadataField, p.Customer)
		ev.SetContext(msg.Context()) // same transaction: the event commits with the invoice
		if err := outbox.Publish(invoiceEvents, ev); err != nil {
			return err
		}
		if msg.Metadata.Get("fail_once") == "1" {
			if _, again := attempted.LoadOrStore(msg.UUID, true); !again {
				failures.Add(1)
				return errors.New("injected failure after the writes: all of them roll back")
			}
		}
		return nil
	})
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()
	<-router.Running()

	// The upstream producer: every tenth payment is sent twice, and the
	// handler fails its first attempt at every tenth one (another tenth).
	sentTwice := 0
	for i := range n {
		p := PaymentReceived{PaymentID: fmt.Sprintf("pay-%05d", i), Customer: fmt.Sprintf("customer-%d", i%7), Cents: int64(500 + i)}
		payload, _ := json.Marshal(p)
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.Metadata.Set(forwarder.DefaultKeyMetadataField, p.Customer)
		if i%10 == 5 {
			msg.Metadata.Set("fail_once", "1")
		}
		copies := 1
		if i%10 == 0 {
			copies, sentTwice = 2, sentTwice+1
		}
		for range copies {
			if err := pub.Publish(payments, msg.Copy()); err != nil {
				return err
			}
		}
	}
	fmt.Printf("sent %d payments, %d of them twice\n", n, sentTwice)

	// Wait until every payment has its invoice and the outbox is empty.
	var invoiceRows, pending int
	for {
		err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+invoices+`), (SELECT count(*) FROM `+dialect.OutboxTable()+`)`).
			Scan(&invoiceRows, &pending)
		if err != nil {
			return err
		}
		if invoiceRows == n && pending == 0 && forwarded.Load() >= int64(n) && duplicates.Load() >= int64(sentTwice) {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("invoices=%d pending events=%d duplicates=%d: %w", invoiceRows, pending, duplicates.Load(), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// invoice_events counts the events the forwarder published. The failed
	// attempts wrote events too, but those rolled back with their invoices,
	// so it equals the number of payments.
	events := forwarded.Load()
	ok := invoiceRows == n && events == int64(n) && duplicates.Load() >= int64(sentTwice)
	fmt.Printf("payments=%d duplicates_skipped=%d failed_attempts=%d invoices=%d invoice_events=%d ok=%t\n",
		n, duplicates.Load(), failures.Load(), invoiceRows, events, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}
