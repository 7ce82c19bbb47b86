package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("write", "business transaction with 0, 1 and 10 outbox messages (Postgres, pgx)", runWrite)
}

// runWrite times one business transaction (insert one order row) bare, with
// one outbox message and with ten, interleaving the variants in rounds so
// that drift of the shared machine hits all of them alike.
func runWrite(ctx context.Context, o options) error {
	iters := orDefault(o.n, 3000)
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer dropSchema(pool, schema)
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), d); err != nil {
		return err
	}
	// The same table without pg_notify, to show what the wakeup costs.
	quiet, err := postgres.New(postgres.Options{Schema: schema, DisableNotify: true})
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".orders (id bigint PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	payload := make([]byte, 256)
	var id int64
	order := func(variant int) (time.Duration, error) {
		msgs, dialect := variant, sqladapters.Dialect(d)
		if variant == quietVariant {
			msgs, dialect = 1, quiet
		}
		id++
		start := time.Now()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".orders (id, customer, amount) VALUES ($1, $2, $3)`, id, "c", 100); err != nil {
			return 0, err
		}
		if variant == roundTripVariant {
			// The floor of any extra statement: one round trip.
			if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
				return 0, err
			}
		} else if msgs > 0 {
			if err := publishN(tx, dialect, id, msgs, payload); err != nil {
				return 0, err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	variants := []int{0, 1, 10, quietVariant, roundTripVariant}
	times := map[int][]time.Duration{}
	// Warm up statement caches and the table.
	for _, v := range variants {
		for range 50 {
			if _, err := order(v); err != nil {
				return err
			}
		}
	}
	const round = 100
	for done := 0; done < iters; done += round {
		for _, v := range variants {
			for range round {
				dt, err := order(v)
				if err != nil {
					return err
				}
				times[v] = append(times[v], dt)
			}
		}
	}
	med := map[int]time.Duration{}
	for _, v := range variants {
		slices.Sort(times[v])
		med[v] = times[v][len(times[v])/2]
		name := fmt.Sprintf("%d outbox message(s)", v)
		switch v {
		case quietVariant:
			name = "1 message, no NOTIFY"
		case roundTripVariant:
			name = "SELECT 1 instead"
		}
		fmt.Printf("%-22s median %8v  p90 %8v  ratio %.2f  (%d transactions)\n", name, med[v], times[v][len(times[v])*9/10],
			float64(med[v])/float64(med[0]), len(times[v]))
	}
	summary("write_overhead_ratio", float64(med[1])/float64(med[0]), "write10_overhead_ratio", float64(med[10])/float64(med[0]))
	return nil
}

// quietVariant marks the variant with one message and no pg_notify;
// roundTripVariant the one that runs SELECT 1 instead of publishing, the
// cost of any extra statement in the transaction.
const (
	quietVariant     = -1
	roundTripVariant = -2
)

func publishN(tx pgx.Tx, d sqladapters.Dialect, id int64, n int, payload []byte) error {
	pub, err := forwarder.NewPublisher(pgxv5.WrapTx(tx), forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		return err
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
		msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprint("order-", id))
	}
	return pub.Publish("orders", msgs...)
}

// benchPostgres connects and creates a schema of its own.
func benchPostgres(ctx context.Context, url string) (*pgxpool.Pool, string, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", err
	}
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, "", fmt.Errorf("postgres unreachable at %s: %w", url, err)
	}
	schema := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		pool.Close()
		return nil, "", err
	}
	return pool, schema, nil
}

func dropSchema(pool *pgxpool.Pool, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
	pool.Close()
}
