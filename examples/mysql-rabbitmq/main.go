// Mysql-rabbitmq forwards a MySQL or MariaDB outbox to RabbitMQ, using
// database/sql with github.com/go-sql-driver/mysql, then consumes the queue
// and checks that every event arrived, in commit order per key.
//
// DSN options that matter (package sqladapters/mysql has the details):
//
//   - parseTime=true is required: millbox reads DATETIME columns (dead
//     letters) into time.Time.
//   - interpolateParams=true is recommended: without it the driver prepares,
//     executes and closes a server-side statement for every call with
//     arguments, two round trips instead of one.
//   - leave loc at UTC and charset at utf8mb4, their defaults.
//
// This example sets the first two itself, whatever the DSN says.
//
//	go run ./examples/mysql-rabbitmq
//	go run ./examples/mysql-rabbitmq -n 10000 -mysql 'app:secret@tcp(db:3306)/app' -amqp amqp://user:pass@rabbit:5672/
//
// MySQL comes from -mysql, else $MILLBOX_MYSQL_DSN, else
// root@tcp(127.0.0.1:3306)/test?parseTime=true; RabbitMQ from -amqp, else
// $MILLBOX_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/. Tables and
// queue are named per run and removed at the end. The last line is a summary
// such as:
//
//	published=1000 received=1000 in_order=true ok=true
package main

import (
	"context"
	"database/sql"
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
	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// batch is the number of events each transaction writes.
const batch = 10

func main() {
	dsn := flag.String("mysql", exampleenv.MySQLDSN(), "MySQL/MariaDB `DSN`")
	amqpURL := flag.String("amqp", exampleenv.AMQPURL(), "RabbitMQ `URL`")
	n := flag.Int("n", 1000, fmt.Sprintf("number of events to publish, %d per transaction", batch))
	flag.Parse()
	if err := run(*dsn, *amqpURL, *n); err != nil {
		fmt.Fprintln(os.Stderr, "mysql-rabbitmq:", err)
		os.Exit(1)
	}
}

func run(dsn, amqpURL string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	cfg, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		return err
	}
	cfg.ParseTime, cfg.InterpolateParams = true, true
	connector, err := mysqldrv.NewConnector(cfg)
	if err != nil {
		return err
	}
	sqlDB := sql.OpenDB(connector)
	defer sqlDB.Close()
	db := stdsql.WrapDB(sqlDB)

	// FOR UPDATE SKIP LOCKED exists from MySQL 8.0.1 and MariaDB 10.6; with
	// it, forwarder instances claiming partitions do not wait for each other.
	skipLocked, err := mysql.DetectSkipLocked(ctx, db)
	if err != nil {
		return err
	}
	prefix := "example_myrabbit_" + suffix
	dialect, err := mysql.New(mysql.Options{OutboxTable: prefix + "_outbox", InboxTable: prefix + "_inbox", SkipLocked: skipLocked})
	if err != nil {
		return err
	}
	shipments := "`" + prefix + "_shipments`"
	defer func() {
		for _, t := range append(dialect.Tables(), shipments) {
			_, _ = sqlDB.ExecContext(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+t)
		}
	}()
	// Migrate, not MigrateTx: MySQL commits DDL implicitly, so migrations
	// cannot share a transaction with anything else.
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	if _, err := sqlDB.ExecContext(ctx, `CREATE TABLE `+shipments+` (id VARCHAR(64) PRIMARY KEY, warehouse VARCHAR(64) NOT NULL)`); err != nil {
		return err
	}

	// RabbitMQ: a durable queue named after the topic on the default
	// exchange, persistent messages, publisher confirms (Publish returns once
	// RabbitMQ has the message) and a channel pool (the default, 0, opens a
	// channel per Publish).
	queue := "millbox_example_myrabbit_" + suffix
	config := amqp.NewDurableQueueConfig(amqpURL)
	config.Publish.ConfirmDelivery = true
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
	// Publish does not declare queues; RabbitMQ confirms, then drops,
	// messages that reach no queue. Declare it first.
	if err := sub.SubscribeInitialize(queue); err != nil {
		return err
	}

	// MySQL has no notifications: a forwarder finds rows written by other
	// processes by looking at the outbox's largest id every WatchInterval
	// (default 5ms). Publishes from this process wake it at once.
	fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: pub})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	start := time.Now()
	for first := 0; first < n; first += batch {
		if err := ship(ctx, sqlDB, dialect, shipments, queue, first, min(first+batch, n)); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d shipments with their events in %v\n", n, time.Since(start).Round(time.Millisecond))

	msgs, err := sub.Subscribe(ctx, queue)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	last := map[string]int{} // warehouse -> last shipment number seen
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
		warehouse := msg.Metadata.Get(forwarder.DefaultKeyMetadataField)
		i, _ := strconv.Atoi(msg.Metadata.Get("shipment"))
		if prev, ok := last[warehouse]; ok && i < prev {
			inOrder = false
			fmt.Printf("%s: shipment %d arrived after %d\n", warehouse, i, prev)
		}
		last[warehouse] = i
	}
	fmt.Printf("forwarded and consumed %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	fmt.Printf("published=%d received=%d in_order=%t ok=%t\n", n, len(seen), inOrder, inOrder)
	if !inOrder {
		return errors.New("check failed")
	}
	return nil
}

// ship records shipments [from, to) and their events in one transaction.
// One Publish call with several messages writes them in one INSERT.
func ship(ctx context.Context, db *sql.DB, dialect *mysql.Dialect, table, topic string, from, to int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // does nothing after Commit
	var msgs []*message.Message
	for i := from; i < to; i++ {
		id, warehouse := "shipment-"+strconv.Itoa(i), "warehouse-"+strconv.Itoa(i%5)
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` (id, warehouse) VALUES (?, ?)`, id, warehouse); err != nil {
			return err
		}
		msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"id":%q,"warehouse":%q}`, id, warehouse))
		msg.Metadata.Set(forwarder.DefaultKeyMetadataField, warehouse) // one warehouse's events stay in order
		msg.Metadata.Set("shipment", strconv.Itoa(i))
		msgs = append(msgs, msg)
	}
	outbox, err := forwarder.NewPublisher(stdsql.WrapTx(tx), forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	if err := outbox.Publish(topic, msgs...); err != nil {
		return err
	}
	return tx.Commit()
}
