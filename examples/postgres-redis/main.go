// Postgres-redis writes events into a PostgreSQL outbox inside pgx
// transactions and forwards them to Redis Streams with millbox's
// redisbatch publisher, one stream per group of accounts, then reads each
// stream with watermill-redisstream's subscriber and checks that every
// account's events arrived once, in commit order, in one stream.
//
//	go run ./examples/postgres-redis
//	go run ./examples/postgres-redis -n 10000 -redis localhost:6379 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable; Redis from -redis,
// else $MILLBOX_REDIS_ADDR, else 127.0.0.1:6379. The schema and the streams
// are named per run and removed at the end. The last line is a summary
// such as:
//
//	published=1000 received=1000 keys=20 streams=4 in_order=true ok=true
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/redisbatch"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// groups is how many streams the accounts are spread over: each stream
// keeps its accounts' order and has a consumer of its own, so the groups
// are consumed in parallel.
const groups = 4

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	redisAddr := flag.String("redis", exampleenv.RedisAddr(), "Redis `address`")
	n := flag.Int("n", 1000, "number of events to publish, one transaction each")
	keys := flag.Int("keys", 20, "number of accounts (ordering keys)")
	flag.Parse()
	if err := run(*pgURL, *redisAddr, *n, max(*keys, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-redis:", err)
		os.Exit(1)
	}
}

func run(pgURL, redisAddr string, n, keys int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_pgredis_" + suffix
	dialect, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		return err
	}
	deposits := `"` + schema + `".deposits`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+deposits+` (account text NOT NULL, seq int NOT NULL, cents bigint NOT NULL, PRIMARY KEY (account, seq))`); err != nil {
		return err
	}

	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", redisAddr, err)
	}
	topic := "deposits:" + suffix
	streams := make([]string, groups)
	for g := range streams {
		streams[g] = fmt.Sprintf("%s:%d", topic, g)
	}
	defer client.Del(context.WithoutCancel(ctx), streams...)

	// redisbatch adds all the messages of a forwarder call (a run of one
	// account's events) to the stream in one MULTI/EXEC: one round trip
	// per call instead of one per message, and all or nothing. Streams
	// are written as watermill-redisstream writes them.
	pub, err := redisbatch.NewPublisher(redisbatch.Config{Client: client})
	if err != nil {
		return err
	}
	defer pub.Close()

	// A stream keeps its entries in the order they were added, and the
	// forwarder adds each account's events in commit order. Topic sends
	// every account to the stream of its group.
	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: pub,
		Topic: func(topic string, msg *message.Message) (string, error) {
			return fmt.Sprintf("%s:%d", topic, uint32(forwarder.KeyHash(destination.Key(msg)))%groups), nil
		},
	})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

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

	// One consumer per stream. watermill-redisstream's subscriber hands
	// one entry at a time to its reader and waits for the ack; a consumer
	// group with a single consumer so reads the stream in order. (Several
	// consumers in one group share a stream's entries and handle them in
	// parallel, and an entry claimed from a consumer that went away comes
	// after later ones.) The group keeps its position in Redis.
	var (
		mu       sync.Mutex
		seen     = map[string]bool{}
		streamOf = map[string]string{} // account -> stream it arrived in
		nextSeq  = map[string]int{}    // account -> next expected seq
		inOrder  = true
		received = make(chan struct{}, n)
	)
	for _, stream := range streams {
		// The subscriber closes its client on Close: one each.
		subClient := redis.NewClient(&redis.Options{Addr: redisAddr})
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:                        subClient,
			ConsumerGroup:                 "reader",
			Consumer:                      "reader-1",
			DisableIndefiniteInitialBlock: true,
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, stream)
		if err != nil {
			return err
		}
		go func() {
			for msg := range msgs {
				account := msg.Metadata.Get(forwarder.DefaultKeyMetadataField)
				seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
				mu.Lock()
				first := !seen[msg.UUID] // at least once: a redelivery is possible, and harmless here
				if first {
					seen[msg.UUID] = true
					if s, ok := streamOf[account]; ok && s != stream {
						inOrder = false
						fmt.Printf("%s in streams %s and %s\n", account, s, stream)
					}
					streamOf[account] = stream
					if seq != nextSeq[account] {
						inOrder = false
						fmt.Printf("%s: seq %d arrived, expected %d\n", account, seq, nextSeq[account])
					}
					nextSeq[account] = seq + 1
				}
				mu.Unlock()
				msg.Ack()
				if first {
					received <- struct{}{}
				}
			}
		}()
	}
	for got := 0; got < n; got++ {
		select {
		case <-received:
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d events: %w", got, n, ctx.Err())
		}
	}
	fmt.Printf("forwarded and read back %d events in %v\n", n, time.Since(start).Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	used := map[string]bool{}
	for _, s := range streamOf {
		used[s] = true
	}
	ok := inOrder && len(streamOf) == min(keys, n)
	fmt.Printf("published=%d received=%d keys=%d streams=%d in_order=%t ok=%t\n", n, len(seen), len(streamOf), len(used), inOrder, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// deposit records a deposit and publishes its event in one transaction,
// through the context publisher.
func deposit(ctx context.Context, pool *pgxpool.Pool, outbox message.Publisher, table, topic, account string, seq int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) // does nothing after Commit
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (account, seq, cents) VALUES ($1, $2, $3)`, account, seq, 100); err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"account":%q,"cents":100}`, account))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, account) // ordering key
	msg.Metadata.Set("seq", strconv.Itoa(seq))
	msg.SetContext(sqladapters.WithTx(ctx, pgxv5.WrapTx(tx)))
	if err := outbox.Publish(topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
