// Postgres-kafka writes events into a PostgreSQL outbox inside pgx
// transactions and forwards them to Kafka, with each event's ordering key
// as the Kafka record key, then reads them back and checks that every
// account's events arrived once, in commit order, on a single partition.
//
//	go run ./examples/postgres-kafka
//	go run ./examples/postgres-kafka -n 10000 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable. Kafka runs in process
// (franz-go's kfake) unless -kafka names brokers. The tables live in a
// schema of their own, dropped at the end. The last line is a summary such
// as:
//
//	published=1000 received=1000 keys=20 in_order=true ok=true
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

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	brokers := flag.String("kafka", "", "comma-separated Kafka `brokers` (default: an in-process Kafka)")
	n := flag.Int("n", 1000, "number of events to publish, one transaction each")
	keys := flag.Int("keys", 20, "number of accounts (ordering keys)")
	flag.Parse()
	if err := run(*pgURL, *brokers, *n, max(*keys, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-kafka:", err)
		os.Exit(1)
	}
}

func run(pgURL, brokers string, n, keys int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_pgkafka_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	// The forwarder finds each commit, from any process, within a few
	// milliseconds by watching the outbox's id sequence. (With
	// postgres.Options{Notify: true}, WrapPool's LISTEN wakes it on the
	// commit itself, at the price of serializing commits.)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	deposits := `"` + schema + `".deposits`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+deposits+` (account text NOT NULL, seq int NOT NULL, cents bigint NOT NULL, PRIMARY KEY (account, seq))`); err != nil {
		return err
	}

	// Kafka: in process unless -kafka is given.
	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	topic, group := "deposits."+suffix, "example-reader-"+suffix
	defer stopKafka([]string{topic}, []string{group}) // runs after the clients below closed
	// The partitioning marshaler makes the ordering key the Kafka record
	// key: sarama's default partitioner hashes it, so all events of one
	// account land on one partition and keep their order there.
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return destination.Key(msg), nil
	})
	// The forwarder deletes a row once Publish returned: make that mean
	// "stored by every in-sync replica".
	pubConfig := kafka.DefaultSaramaSyncPublisherConfig()
	pubConfig.Producer.RequiredAcks = sarama.WaitForAll
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers: addrs, Marshaler: marshaler, OverwriteSaramaConfig: pubConfig,
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
		Brokers: addrs, ConsumerGroup: group, Topics: []string{topic}, Partitions: 6,
	})
	if err != nil {
		return err
	}
	defer sub.Close()

	// The forwarder publishes committed outbox rows to Kafka until Close;
	// it would usually start with the application.
	fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: pub})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	// Publish: each deposit and its event commit in one pgx transaction.
	// One outbox publisher serves every transaction.
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		account, seq := "account-"+strconv.Itoa(i%keys), i/keys
		if err := deposit(ctx, pool, outbox, deposits, topic, account, seq); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d deposits with their events in %v\n", n, time.Since(start).Round(time.Millisecond))

	// Read back and check.
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	partitionOf := map[string]int32{} // account -> partition
	nextSeq := map[string]int{}       // account -> next expected seq
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
			continue // at least once: a redelivery is possible, and harmless here
		}
		seen[msg.UUID] = true
		key, _ := kafka.MessageKeyFromCtx(msg.Context())
		partition, _ := kafka.MessagePartitionFromCtx(msg.Context())
		account := string(key)
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		if p, ok := partitionOf[account]; ok && p != partition {
			inOrder = false
			fmt.Printf("%s on partitions %d and %d\n", account, p, partition)
		}
		partitionOf[account] = partition
		if seq != nextSeq[account] {
			inOrder = false
			fmt.Printf("%s: seq %d arrived, expected %d\n", account, seq, nextSeq[account])
		}
		nextSeq[account] = seq + 1
	}
	fmt.Printf("forwarded and read back %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	ok := inOrder && len(partitionOf) == min(keys, n)
	fmt.Printf("published=%d received=%d keys=%d in_order=%t ok=%t\n", n, len(seen), len(partitionOf), inOrder, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// deposit records a deposit and publishes its event in one transaction.
func deposit(ctx context.Context, pool *pgxpool.Pool, outbox *forwarder.Publisher, table, topic, account string, seq int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (account, seq, cents) VALUES ($1, $2, $3)`, account, seq, 100); err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"account":%q,"cents":100}`, account))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, account) // ordering key, and Kafka key
	msg.Metadata.Set("seq", strconv.Itoa(seq))
	// The event's row commits or rolls back with the deposit.
	if err := outbox.PublishTx(ctx, pgxv5.WrapTx(tx), topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
