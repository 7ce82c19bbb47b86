// Cdc forwards a PostgreSQL outbox to Kafka through logical replication
// (forwarder/cdc) instead of polling it, with two instances: one streams,
// the other stands by. Half way through the active one stops, the standby
// takes the slot over, and every account's events still arrive in commit
// order.
//
//	go run ./examples/cdc
//	go run ./examples/cdc -n 10000 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable; it needs
// wal_level = logical and a role with REPLICATION. Kafka runs in process
// (franz-go's kfake) unless -kafka names brokers. The tables live in a schema
// of their own; schema, slot and publication are dropped at the end. The last
// line is a summary such as:
//
//	published=1000 received=1000 keys=20 in_order=true took_over=true ok=true
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

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/forwarder/kafkabatch"
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
	if err := run(*pgURL, *brokers, max(*n, 2), max(*keys, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "cdc:", err)
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
	schema := "millbox_example_cdc_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}

	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	topic, group := "deposits."+suffix, "example-reader-"+suffix
	defer stopKafka([]string{topic}, []string{group})
	// kafkabatch makes the ordering key the Kafka record key: one account,
	// one partition.
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: addrs})
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

	// Every instance runs the same configuration: the forwarder with the
	// change-data-capture source. Setup creates the publication and the
	// slot once; Drop removes them, since an abandoned slot keeps every
	// WAL segment from its position on.
	src := cdc.Source{
		ConnString:  pgURL,
		Slot:        "millbox_example_" + suffix,
		Publication: "millbox_example_" + suffix,
	}
	cfg := forwarder.Config{DB: db, Dialect: dialect, Destination: pub, Source: src}
	if err := cdc.Setup(ctx, db, dialect, src); err != nil {
		return err
	}
	defer func() {
		if err := cdc.Drop(context.WithoutCancel(ctx), db, dialect, src); err != nil {
			fmt.Fprintln(os.Stderr, "drop slot:", err)
		}
	}()
	first, stopFirst, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	defer stopFirst()
	// Ready means running: the instance then takes the slot within moments
	// when no other instance streams from it.
	if err := waitActive(ctx, first); err != nil {
		return err
	}
	second, stopSecond, err := start(ctx, cfg)
	if err != nil {
		return err
	}
	defer stopSecond()
	if active(second) {
		return errors.New("the second instance should stand by while the first streams")
	}

	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		return err
	}
	start := time.Now()
	for i := range n {
		if i == n/2 {
			// The active instance stops (a deploy, a crash); the standby
			// takes the slot over where it was confirmed.
			stopFirst()
			fmt.Printf("stopped the active instance after %d events\n", i)
		}
		msg := message.NewMessage(strconv.Itoa(i), fmt.Appendf(nil, `{"n":%d}`, i))
		account := "account-" + strconv.Itoa(i%keys)
		msg.Metadata.Set(forwarder.DefaultKeyMetadataField, account)
		msg.Metadata.Set("seq", strconv.Itoa(i/keys))
		if err := publish(ctx, pool, outbox, topic, msg); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d events in %v\n", n, time.Since(start).Round(time.Millisecond))

	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	nextSeq := map[string]int{}
	inOrder := true
	for len(seen) < n {
		var msg *message.Message
		select {
		case msg = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d events: %w", len(seen), n, ctx.Err())
		}
		msg.Ack()
		account := msg.Metadata.Get(forwarder.DefaultKeyMetadataField)
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		if seen[msg.UUID] {
			continue // at least once: a takeover may send a few events again
		}
		seen[msg.UUID] = true
		if seq != nextSeq[account] {
			inOrder = false
			fmt.Printf("%s: seq %d arrived, expected %d\n", account, seq, nextSeq[account])
		}
		nextSeq[account] = seq + 1
	}
	fmt.Printf("streamed and read back %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	tookOver := active(second)
	ok := inOrder && tookOver && len(nextSeq) == min(keys, n)
	fmt.Printf("published=%d received=%d keys=%d in_order=%t took_over=%t ok=%t\n", n, len(seen), len(nextSeq), inOrder, tookOver, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// start runs one CDC forwarder instance and waits until it streams or
// stands by.
func start(ctx context.Context, cfg forwarder.Config) (*forwarder.Forwarder, func(), error) {
	f, err := forwarder.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	if err := f.Ready(ctx); err != nil {
		return nil, nil, fmt.Errorf("cdc forwarder: %w", err)
	}
	stopped := false
	return f, func() {
		if stopped {
			return
		}
		stopped = true
		_ = f.Close()
		if err := <-done; err != nil && !errors.Is(err, forwarder.ErrClosed) {
			fmt.Fprintln(os.Stderr, "cdc forwarder:", err)
		}
	}, nil
}

// waitActive waits until f streams from the slot.
// active tells whether f is the reader streaming from the slot: it then
// holds the slot's one partition.
func active(f *forwarder.Forwarder) bool { return len(f.Partitions()) > 0 }

func waitActive(ctx context.Context, f *forwarder.Forwarder) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !active(f) {
		select {
		case <-ctx.Done():
			return errors.New("the first instance did not take the slot within 30s")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// publish commits one event in a transaction of its own; an application
// writes its business rows in the same transaction.
func publish(ctx context.Context, pool *pgxpool.Pool, outbox *forwarder.Publisher, topic string, msg *message.Message) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if err := outbox.PublishTx(ctx, pgxv5.WrapTx(tx), topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
