// Postgres-rabbitmq forwards a PostgreSQL outbox to RabbitMQ with
// publisher confirms and a channel pool, then consumes the queue and checks
// that every event arrived, in commit order per key.
//
// It also shows the context-mode outbox publisher: one long-lived
// forwarder.NewContextPublisher (a plain message.Publisher, usable behind
// any Watermill component) that finds the transaction in each message's
// context, put there with sqladapters.WithTx.
//
//	go run ./examples/postgres-rabbitmq
//	go run ./examples/postgres-rabbitmq -n 10000 -amqp amqp://user:pass@rabbit:5672/ -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable; RabbitMQ from -amqp,
// else $MILLBOX_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/. The
// schema and the queue are named per run and removed at the end. The last
// line is a summary such as:
//
//	published=1000 received=1000 in_order=true ok=true
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	amqpURL := flag.String("amqp", exampleenv.AMQPURL(), "RabbitMQ `URL`")
	n := flag.Int("n", 1000, "number of events to publish, one transaction each")
	flag.Parse()
	if err := run(*pgURL, *amqpURL, *n); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-rabbitmq:", err)
		os.Exit(1)
	}
}

func run(pgURL, amqpURL string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_pgrabbit_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	tickets := `"` + schema + `".tickets`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+tickets+` (id text PRIMARY KEY, project text NOT NULL)`); err != nil {
		return err
	}

	// RabbitMQ: a durable queue named after the topic on the default
	// exchange, persistent messages.
	queue := "millbox_example_pgrabbit_" + suffix
	config := amqp.NewDurableQueueConfig(amqpURL)
	// Publish waits until RabbitMQ confirms it has the message. Without
	// confirms, Publish returns once the bytes are written to the socket,
	// and the forwarder would delete rows the broker may never have taken.
	config.Publish.ConfirmDelivery = true
	// The default pool size 0 opens a channel for every Publish (and with
	// confirms switches it to confirm mode): about 0.7k msg/s. With a pool,
	// the forwarder's concurrent lanes publish over channels that stay
	// open: ~10k msg/s with 64 of them.
	config.Publish.ChannelPoolSize = 64
	// Deferred first, so it runs last, after the clients closed.
	defer exampleenv.DeleteQueue(amqpURL, queue)
	// watermill-amqp v3 needs a non-nil logger.
	pub, err := amqp.NewPublisher(config, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := amqp.NewSubscriber(config, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer sub.Close()
	// Publish does not declare the queue, and RabbitMQ confirms, then
	// drops, messages that reach no queue: declare it before forwarding.
	if err := sub.SubscribeInitialize(queue); err != nil {
		return err
	}

	fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: pub})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	// One outbox publisher for the whole application; each message
	// brings its transaction in its context.
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		project := "project-" + strconv.Itoa(i%10)
		if err := openTicket(ctx, pool, outbox, tickets, queue, project, i); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d tickets with their events in %v\n", n, time.Since(start).Round(time.Millisecond))

	msgs, err := sub.Subscribe(ctx, queue)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	last := map[string]int{} // project -> last ticket number seen
	inOrder := true
	for len(seen) < n {
		var msg *message.Message
		select {
		case msg = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d events: %w", len(seen), n, ctx.Err())
		}
		msg.Ack()
		if seen[msg.UUID] {
			continue // at least once: a redelivery is possible
		}
		seen[msg.UUID] = true
		project := msg.Metadata.Get(forwarder.DefaultKeyMetadataField)
		i, _ := strconv.Atoi(msg.Metadata.Get("ticket"))
		if prev, ok := last[project]; ok && i < prev {
			inOrder = false
			fmt.Printf("%s: ticket %d arrived after %d\n", project, i, prev)
		}
		last[project] = i
	}
	fmt.Printf("forwarded and consumed %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	fmt.Printf("published=%d received=%d in_order=%t ok=%t\n", n, len(seen), inOrder, inOrder)
	if !inOrder {
		return errors.New("check failed")
	}
	return nil
}

// openTicket inserts a ticket and publishes its event in one transaction,
// through the context publisher.
func openTicket(ctx context.Context, pool *pgxpool.Pool, outbox message.Publisher, table, topic, project string, i int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	id := "ticket-" + strconv.Itoa(i)
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, project) VALUES ($1, $2)`, id, project); err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"id":%q,"project":%q}`, id, project))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, project) // one project's events stay in order
	msg.Metadata.Set("ticket", strconv.Itoa(i))
	msg.SetContext(sqladapters.WithTx(ctx, pgxv5.WrapTx(tx)))
	if err := outbox.Publish(topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
