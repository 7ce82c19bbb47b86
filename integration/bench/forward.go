package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	stdsql "database/sql"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("drain-limit", "rate at which pgx claims and deletes outbox rows (batch 1000, no broker): the database's ceiling", runDrainLimit)
	register("forward-noop", "millbox forwarder draining to a publisher that drops messages (the forwarder's own ceiling)", runForwardNoop)
}

// prefill commits n messages through the millbox publisher: keys ordering
// keys, payload bytes each, 5,000 messages per transaction.
func prefill(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, n, keys, payload int) error {
	return prefillWith(ctx, db, d, n, keys, payload, false)
}

// prefillWith is prefill, with a publisher without a table when
// withoutTable is set.
func prefillWith(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, n, keys, payload int, withoutTable bool) error {
	body := make([]byte, payload)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	const perTx = 5000
	for done := 0; done < n; done += perTx {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return err
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d, WithoutTable: withoutTable, Slot: "*"})
		if err != nil {
			return err
		}
		msgs := make([]*message.Message, 0, perTx)
		for i := done; i < min(done+perTx, n); i++ {
			m := message.NewMessage(watermill.NewUUID(), body)
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%keys))
			m.Metadata.Set("seq", strconv.Itoa(i/keys))
			msgs = append(msgs, m)
		}
		if err := pub.Publish("bench", msgs...); err != nil {
			sqladapters.Rollback(tx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pgOutbox connects, creates a schema and migrates a millbox outbox in it.
func pgOutbox(ctx context.Context, url string) (*pgxpool.Pool, *postgres.Dialect, func(), error) {
	pool, schema, err := benchPostgres(ctx, url)
	if err != nil {
		return nil, nil, nil, err
	}
	cleanup := func() { dropSchema(pool, schema) }
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err == nil {
		err = sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), d)
	}
	if err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	return pool, d, cleanup, nil
}

func runDrainLimit(ctx context.Context, o options) error {
	n := orDefault(o.n, 200000)
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := prefill(ctx, pgxv5.WrapPool(pool), d, n, 200, 256); err != nil {
		return err
	}
	// Fresh statistics, as autovacuum would have them on a live outbox.
	if err := analyze(ctx, pgxv5.WrapPool(pool), d, "postgres"); err != nil {
		return err
	}
	rate, err := drainLimit(ctx, pool, d)
	if err != nil {
		return err
	}
	fmt.Printf("drained %d rows with DELETE ... RETURNING over 1,000-row SKIP LOCKED claims: %.0f rows/s\n", n, rate)
	// The same rows through millbox to Kafka, in the same run.
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	mill, err := millboxToKafka(ctx, o, k, n, false)
	if err != nil {
		return err
	}
	batch, err := millboxToKafka(ctx, o, k, n, true)
	if err != nil {
		return err
	}
	fmt.Printf("millbox to Kafka: %.0f msg/s with watermill-kafka's publisher, %.0f msg/s with kafkabatch\n", mill, batch)
	summary("drain_limit_msgs_per_s", int(rate), "efficiency", mill/rate, "efficiency_batch", batch/rate)
	return nil
}

// drainLimit claims and deletes every row, 1,000 at a time, from one
// connection, reading back what a forwarder needs: the raw cost of moving
// rows out of the outbox.
func drainLimit(ctx context.Context, pool *pgxpool.Pool, d *postgres.Dialect) (float64, error) {
	q := `WITH c AS (SELECT id FROM ` + d.OutboxTable() + ` ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
DELETE FROM ` + d.OutboxTable() + ` o USING c WHERE o.id = c.id RETURNING o.id, o.topic, o.uuid, o.payload, o.metadata, o.key, o.attempts`
	start := time.Now()
	total := 0
	for {
		rows, err := pool.Query(ctx, q)
		if err != nil {
			return 0, err
		}
		n := 0
		for rows.Next() {
			var id int64
			var topic, uuid string
			var payload, md []byte
			var key *string
			var attempts int
			if err := rows.Scan(&id, &topic, &uuid, &payload, &md, &key, &attempts); err != nil {
				rows.Close()
				return 0, err
			}
			n++
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

// countingPublisher drops messages and counts them.
type countingPublisher struct {
	n    atomic.Int64
	once sync.Once
	all  chan struct{}
	want int64
}

func newCounting(want int) *countingPublisher {
	return &countingPublisher{all: make(chan struct{}), want: int64(want)}
}

func (c *countingPublisher) Publish(_ string, msgs ...*message.Message) error {
	if c.n.Add(int64(len(msgs))) >= c.want {
		c.once.Do(func() { close(c.all) })
	}
	return nil
}

func (c *countingPublisher) Close() error { return nil }

// millboxForward runs one forwarder until dest has seen n messages and
// returns the rate.
func millboxForward(ctx context.Context, cfg forwarder.Config, arrived <-chan struct{}) (float64, error) {
	f, err := forwarder.New(cfg)
	if err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	select {
	case <-arrived:
	case err := <-errc:
		return 0, fmt.Errorf("forwarder stopped: %v", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	elapsed := time.Since(start)
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := <-errc; err != nil {
		return 0, err
	}
	return 1 / elapsed.Seconds(), nil
}

func runForwardNoop(ctx context.Context, o options) error {
	n := orDefault(o.n, 200000)
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return err
	}
	dest := newCounting(n)
	per, err := millboxForward(ctx, forwarder.Config{DB: db, Dialect: d, Destination: dest, DeadLetterHoldsKey: o.hold}, dest.all)
	if err != nil {
		return err
	}
	summary("millbox_noop_msgs_per_s", int(per*float64(n)))
	return nil
}
