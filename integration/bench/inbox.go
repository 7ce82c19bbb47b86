package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("inbox", "consumer with the inbox middleware vs the same handler in its own tx (GoChannel, Postgres, pgx)", runInbox)
}

// runInbox measures the inbox middleware's cost on a consumer whose handler
// does one business insert. Variants, interleaved in rounds so that drift of
// the shared machine hits both alike:
//
//   - inbox: begin, record the message id, insert, commit (the middleware);
//   - plain: begin, insert, commit in the handler, no inbox.
//
// Concurrency is that of a consumer of a partitioned topic: INBOX_CONCURRENCY
// (default 16) topics, one router handler each, like Kafka partitions or
// RabbitMQ consumers. Each topic is fed by its own goroutine that publishes
// with BlockPublishUntilSubscriberAck, so each handler has exactly one
// message in flight and the next arrives as soon as it is acked. (A
// persistent GoChannel would instead hand every stored message to the router
// at once, one goroutine each: unbounded concurrency no broker gives.) The
// messages are built before the clock starts.
func runInbox(ctx context.Context, o options) error {
	n := orDefault(o.n, 20000)
	conc, err := strconv.Atoi(env("INBOX_CONCURRENCY", "16"))
	if err != nil || conc < 1 {
		return fmt.Errorf("INBOX_CONCURRENCY must be a positive integer")
	}
	rounds := 3
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer dropSchema(pool, schema)
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return err
	}
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		return err
	}
	orders := `"` + schema + `".orders`
	if _, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		return err
	}
	insert := `INSERT INTO ` + orders + ` (id, amount) VALUES ($1, $2)`
	var syncCommit string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit); err != nil {
		return err
	}
	fmt.Printf("%d messages per run, %d concurrent handlers, pool of %d connections, synchronous_commit=%s\n",
		n, conc, pool.Config().MaxConns, syncCommit)

	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{DB: db, Dialect: d, Consumer: "bench"})
	if err != nil {
		return err
	}
	variants := map[string]inboxBenchVariant{
		"inbox": {
			middleware: inboxMW,
			handler: func(msg *message.Message) error {
				tx, err := pgxv5.TxFromContext(msg.Context())
				if err != nil {
					return err
				}
				_, err = tx.Exec(msg.Context(), insert, msg.UUID, 100)
				return err
			},
		},
		"plain": {
			handler: func(msg *message.Message) error {
				ctx := msg.Context()
				tx, err := pool.Begin(ctx)
				if err != nil {
					return err
				}
				defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
				if _, err := tx.Exec(ctx, insert, msg.UUID, 100); err != nil {
					return err
				}
				return tx.Commit(ctx)
			},
		},
	}
	reset := func() error {
		_, err := pool.Exec(ctx, `TRUNCATE `+orders+`, `+d.InboxTable())
		return err
	}
	// Warm up connections, statement caches and the tables.
	for _, name := range []string{"inbox", "plain"} {
		if _, err := variants[name].run(ctx, pool, orders, min(n, 2000), conc); err != nil {
			return fmt.Errorf("warm-up %s: %w", name, err)
		}
	}
	rates := map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, name := range []string{"inbox", "plain"} {
			if err := reset(); err != nil {
				return err
			}
			rate, err := variants[name].run(ctx, pool, orders, n, conc)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			rates[name] = append(rates[name], rate)
			fmt.Printf("round %d  %-5s %8.0f msg/s\n", round, name, rate)
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	in, plain := med(rates["inbox"]), med(rates["plain"])
	fmt.Printf("median of %d rounds: inbox %.0f msg/s, plain %.0f msg/s\n", rounds, in, plain)
	summary("inbox_msgs_per_s", int(in), "plain_msgs_per_s", int(plain), "overhead_ratio", plain/in)
	return nil
}

type inboxBenchVariant struct {
	middleware message.HandlerMiddleware // nil for none
	handler    message.NoPublishHandlerFunc
}

// run consumes n fresh messages over conc topics and returns messages per
// second, checking that every message left its order row.
func (v inboxBenchVariant) run(ctx context.Context, pool *pgxpool.Pool, orders string, n, conc int) (float64, error) {
	logger := watermill.NopLogger{}
	gc := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, logger)
	defer gc.Close()
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 30 * time.Second}, logger)
	if err != nil {
		return 0, err
	}
	if v.middleware != nil {
		router.AddMiddleware(v.middleware)
	}
	var failMu sync.Mutex
	var firstErr error
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil {
				failMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				failMu.Unlock()
			}
			return out, err
		}
	})
	topics := make([]string, conc)
	for i := range topics {
		topics[i] = "orders-" + strconv.Itoa(i)
		router.AddConsumerHandler(topics[i], topics[i], gc, v.handler)
	}
	msgs := make([][]*message.Message, conc)
	for i := range n {
		msgs[i%conc] = append(msgs[i%conc], message.NewMessage(watermill.NewUUID(), []byte(`{"amount":100}`)))
	}
	runErr := make(chan error, 1)
	go func() { runErr <- router.Run(ctx) }()
	select {
	case <-router.Running():
	case err := <-runErr:
		return 0, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	pubErrs := make([]error, conc)
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range msgs[i] {
				if err := gc.Publish(topics[i], m); err != nil {
					pubErrs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := router.Close(); err != nil {
		return 0, err
	}
	if err := <-runErr; err != nil {
		return 0, err
	}
	if err := errors.Join(pubErrs...); err != nil {
		return 0, err
	}
	if firstErr != nil {
		return 0, fmt.Errorf("a handler failed (its message was redelivered): %w", firstErr)
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+orders).Scan(&rows); err != nil {
		return 0, err
	}
	if rows < n {
		return 0, fmt.Errorf("%d order rows after %d messages", rows, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}
