// Postgres-nats writes events into a PostgreSQL outbox inside pgx
// transactions and forwards them to a NATS JetStream stream with
// watermill-nats, one subject per group of accounts, then reads each
// subject with a consumer of its own and checks that every account's
// events arrived once, in commit order, on one subject.
//
//	go run ./examples/postgres-nats
//	go run ./examples/postgres-nats -n 10000 -nats nats://localhost:4222 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable; NATS, with JetStream
// enabled, from -nats, else $MILLBOX_NATS_URL, else nats://127.0.0.1:4222.
// The schema and the stream are named per run and removed at the end. The
// last line is a summary such as:
//
//	published=1000 received=1000 keys=20 subjects=4 in_order=true ok=true
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
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// groups is how many subjects the accounts are spread over: each subject
// keeps its accounts' order and has a consumer of its own, so the groups
// are consumed in parallel.
const groups = 4

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	natsURL := flag.String("nats", exampleenv.NATSURL(), "NATS `URL` (JetStream enabled)")
	n := flag.Int("n", 1000, "number of events to publish, one transaction each")
	keys := flag.Int("keys", 20, "number of accounts (ordering keys)")
	flag.Parse()
	if err := run(*pgURL, *natsURL, *n, max(*keys, 1)); err != nil {
		fmt.Fprintln(os.Stderr, "postgres-nats:", err)
		os.Exit(1)
	}
}

func run(pgURL, natsURL string, n, keys int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	suffix := fmt.Sprintf("%08x", rand.Uint32())

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := "millbox_example_pgnats_" + suffix
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

	// nats.go gives up reconnecting after 60 attempts (two minutes) by
	// default and then stays closed: a forwarder would never get through
	// again after a longer outage. Reconnect forever.
	options := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}

	// The stream takes the subjects deposits_<run>.<group>: a stream keeps
	// the order in which JetStream acknowledged its messages, so each
	// subject holds its accounts' events in commit order. Create streams
	// up front, as part of deploying; JetStream refuses messages for a
	// subject no stream takes.
	stream := "deposits_" + suffix
	if err := createStream(ctx, natsURL, stream); err != nil {
		return err
	}
	defer deleteStream(natsURL, stream)

	// watermill-nats with JetStream on: Publish returns once the stream
	// acknowledged each message, so the forwarder deletes only rows
	// JetStream has.
	pub, err := wmnats.NewPublisher(wmnats.PublisherConfig{
		URL: natsURL, NatsOptions: options, Marshaler: &wmnats.NATSMarshaler{},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()

	// The forwarder keeps each account's events in commit order; Topic
	// sends every account to the subject of its group.
	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: pub,
		Topic: func(topic string, msg *message.Message) (string, error) {
			return fmt.Sprintf("%s.%d", topic, uint32(forwarder.KeyHash(destination.Key(msg)))%groups), nil
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
		if err := deposit(ctx, pool, outbox, deposits, stream, account, seq); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d deposits with their events in %v\n", n, time.Since(start).Round(time.Millisecond))

	// One consumer per subject. A consumer keeps the subject's order when
	// it handles one message at a time and JetStream lets it have one
	// unacknowledged message at most (MaxAckPending 1): with more, a
	// message redelivered after AckWait would come after later ones.
	// The durable name keeps the consumer's position across restarts.
	var (
		mu       sync.Mutex
		seen     = map[string]bool{}
		subject  = map[string]string{} // account -> subject it arrived on
		nextSeq  = map[string]int{}    // account -> next expected seq
		inOrder  = true
		received = make(chan struct{}, n)
	)
	for g := range groups {
		subj := fmt.Sprintf("%s.%d", stream, g)
		sub, err := wmnats.NewSubscriber(wmnats.SubscriberConfig{
			URL: natsURL, NatsOptions: options, Unmarshaler: &wmnats.NATSMarshaler{},
			AckWaitTimeout: 30 * time.Second,
			JetStream: wmnats.JetStreamConfig{
				SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit(), nats.MaxAckPending(1)},
				DurablePrefix:    fmt.Sprintf("reader_%s_%d", suffix, g),
			},
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		defer sub.Close()
		msgs, err := sub.Subscribe(ctx, subj)
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
					if s, ok := subject[account]; ok && s != subj {
						inOrder = false
						fmt.Printf("%s on subjects %s and %s\n", account, s, subj)
					}
					subject[account] = subj
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
	for _, s := range subject {
		used[s] = true
	}
	ok := inOrder && len(subject) == min(keys, n)
	fmt.Printf("published=%d received=%d keys=%d subjects=%d in_order=%t ok=%t\n", n, len(seen), len(subject), len(used), inOrder, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// createStream creates a file-backed stream taking the subjects name.>.
func createStream(ctx context.Context, url, name string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("nats at %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage})
	return err
}

// deleteStream deletes the run's stream, reporting a failure on standard
// error: a failed clean-up must not fail the example.
func deleteStream(url, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(url)
	if err == nil {
		defer nc.Close()
		var js jetstream.JetStream
		if js, err = jetstream.New(nc); err == nil {
			err = js.DeleteStream(ctx, name)
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "delete stream %s: %v\n", name, err)
	}
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
