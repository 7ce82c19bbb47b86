package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("inbox", "consumer with the inbox middleware vs the same handler in its own tx (GoChannel; -db postgres or mysql)", runInbox)
}

// runInbox measures the inbox middleware's cost on a consumer whose handler
// does one business insert. Variants, interleaved in rounds so that drift of
// the shared machine hits both alike:
//
//   - inbox: begin and record the message id, insert, commit (the
//     middleware; on pgx BEGIN and the record share one round trip);
//   - inbox-2rt (pgx only): the middleware with BEGIN in a round trip of
//     its own, as on database/sql;
//   - floor: the handler records the message id itself, in a table of the
//     inbox's columns with nothing but its primary key, with the same
//     statement and round trips as the middleware, then inserts and
//     commits: what storing an inbox row costs at least;
//   - plain: begin, insert, commit in the handler, no inbox.
//
// Both run through the same sqladapters.DB (pgx on Postgres, database/sql
// with interpolateParams on MySQL), so the ratio is the inbox's cost alone.
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
	b, err := newInboxBenchDB(ctx, o)
	if err != nil {
		return err
	}
	defer b.cleanup()
	fmt.Printf("%s: %d messages per run, %d concurrent handlers, pool of %d connections, %s\n",
		o.db, n, conc, b.conns, b.durability)

	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{DB: b.db, Dialect: b.d, Consumer: "bench"})
	if err != nil {
		return err
	}
	// The same middleware on a DB that cannot send BEGIN with the inbox
	// insert: a round trip of its own for each.
	separateMW, err := middleware.NewInbox(middleware.InboxConfig{DB: separateBegin{b.db}, Dialect: b.d, Consumer: "bench"})
	if err != nil {
		return err
	}
	inboxHandler := func(msg *message.Message) error {
		tx, err := sqladapters.TxFromContext(msg.Context())
		if err != nil {
			return err
		}
		_, err = tx.Exec(msg.Context(), b.insert, msg.UUID, 100)
		return err
	}
	floorInsert := `INSERT` + b.ignore + ` INTO ` + b.floor + ` (consumer, message_id) VALUES (` + b.params[0] + `, ` + b.params[1] + `)` + b.onConflict
	variants := map[string]inboxBenchVariant{
		"inbox": {middleware: inboxMW, handler: inboxHandler},
		"floor": {
			handler: func(msg *message.Message) error {
				ctx := msg.Context()
				var tx sqladapters.Tx
				var n int64
				var err error
				if be, ok := b.db.(sqladapters.BeginExecer); ok {
					tx, n, err = be.BeginExec(ctx, sql.TxOptions{}, floorInsert, "bench", msg.UUID)
				} else if tx, err = b.db.Begin(ctx, sql.TxOptions{}); err == nil {
					n, err = tx.Exec(ctx, floorInsert, "bench", msg.UUID)
				}
				if err != nil {
					if tx != nil {
						sqladapters.Rollback(tx)
					}
					return err
				}
				defer sqladapters.Rollback(tx) // a no-op after commit
				if n != 1 {
					return fmt.Errorf("the floor's inbox insert affected %d rows", n)
				}
				if _, err := tx.Exec(ctx, b.insert, msg.UUID, 100); err != nil {
					return err
				}
				return tx.Commit(ctx)
			},
		},
		"inbox-2rt": {middleware: separateMW, handler: inboxHandler},
		"plain": {
			handler: func(msg *message.Message) error {
				ctx := msg.Context()
				tx, err := b.db.Begin(ctx, sql.TxOptions{})
				if err != nil {
					return err
				}
				defer sqladapters.Rollback(tx) // a no-op after commit
				if _, err := tx.Exec(ctx, b.insert, msg.UUID, 100); err != nil {
					return err
				}
				return tx.Commit(ctx)
			},
		},
	}
	names := []string{"inbox", "floor", "plain"}
	if _, ok := b.db.(inbox.BeginExecer); ok {
		names = []string{"inbox", "inbox-2rt", "floor", "plain"}
	}
	// Warm up connections, statement caches and the tables.
	for _, name := range names {
		if _, err := variants[name].run(ctx, b, min(n, 2000), conc); err != nil {
			return fmt.Errorf("warm-up %s: %w", name, err)
		}
	}
	rates := map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, name := range names {
			if err := b.reset(ctx); err != nil {
				return err
			}
			rate, err := variants[name].run(ctx, b, n, conc)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			rates[name] = append(rates[name], rate)
			fmt.Printf("round %d  %-9s %8.0f msg/s\n", round, name, rate)
		}
	}
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	in, floor, plain := med(rates["inbox"]), med(rates["floor"]), med(rates["plain"])
	fmt.Printf("median of %d rounds: inbox %.0f msg/s, floor %.0f msg/s, plain %.0f msg/s\n", rounds, in, floor, plain)
	kv := []any{"inbox_msgs_per_s", int(in), "plain_msgs_per_s", int(plain), "overhead_ratio", plain / in, "inbox_floor_ratio", plain / floor}
	if r := rates["inbox-2rt"]; r != nil {
		sep := med(r)
		fmt.Printf("inbox with BEGIN in a round trip of its own: %.0f msg/s, ×%.2f\n", sep, plain/sep)
		kv = append(kv, "overhead_ratio_2rt", plain/sep)
	}
	summary(kv...)
	return nil
}

// separateBegin hides a DB's BeginExec, so that the inbox middleware
// begins the transaction and records the message in two round trips.
type separateBegin struct{ sqladapters.DB }

// inboxBenchDB is the database of the inbox bench: a fresh millbox
// installation with an orders table beside it.
type inboxBenchDB struct {
	db     sqladapters.DB
	d      sqladapters.Dialect
	orders string // quoted table name
	insert string // inserts an order: id, amount
	// floor is a table of the inbox's columns with only its primary key;
	// params are the database's first two placeholders, ignore and
	// onConflict what make its insert of a duplicate a no-op, as the
	// inbox's is.
	floor              string
	params             [2]string
	ignore, onConflict string
	conns              int
	cleanup            func()
	// durability names the setting that decides what a commit costs.
	durability string
}

func newInboxBenchDB(ctx context.Context, o options) (*inboxBenchDB, error) {
	switch o.db {
	case "postgres":
		pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
		if err != nil {
			return nil, err
		}
		b := &inboxBenchDB{
			db: pgxv5.WrapPool(pool), d: d, orders: `"` + d.Schema() + `".orders`,
			conns: int(pool.Config().MaxConns), cleanup: cleanup,
		}
		b.insert = `INSERT INTO ` + b.orders + ` (id, amount) VALUES ($1, $2)`
		b.floor, b.params, b.onConflict = `"`+d.Schema()+`".inbox_floor`, [2]string{"$1", "$2"}, ` ON CONFLICT DO NOTHING`
		var syncCommit string
		if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&syncCommit); err != nil {
			cleanup()
			return nil, err
		}
		b.durability = "synchronous_commit=" + syncCommit
		if err := b.create(ctx, `id text PRIMARY KEY, amount bigint NOT NULL`); err != nil {
			return nil, err
		}
		return b, b.createFloor(ctx, `consumer text NOT NULL, message_id text NOT NULL, received_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, message_id)`)
	case "mysql":
		db, d, cleanup, err := mysqlOutbox(ctx, o.mysqlDSN)
		if err != nil {
			return nil, err
		}
		orders := "`" + strings.Trim(d.OutboxTable(), "`") + "_orders`"
		floor := "`" + strings.Trim(d.OutboxTable(), "`") + "_inbox_floor`"
		b := &inboxBenchDB{
			db: db, d: d, orders: orders, conns: mysqlBenchConns,
			insert: `INSERT INTO ` + orders + ` (id, amount) VALUES (?, ?)`,
			floor:  floor, params: [2]string{"?", "?"}, ignore: " IGNORE",
			cleanup: func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				_, _ = db.Exec(ctx, `DROP TABLE IF EXISTS `+orders)
				_, _ = db.Exec(ctx, `DROP TABLE IF EXISTS `+floor)
				cleanup()
			},
		}
		var flush, binlog string
		if err := b.queryRow(ctx, `SELECT @@innodb_flush_log_at_trx_commit, @@log_bin`, &flush, &binlog); err != nil {
			b.cleanup()
			return nil, err
		}
		b.durability = "innodb_flush_log_at_trx_commit=" + flush + " log_bin=" + binlog
		if err := b.create(ctx, `id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL`); err != nil {
			return nil, err
		}
		return b, b.createFloor(ctx, `consumer VARBINARY(255) NOT NULL, message_id VARBINARY(512) NOT NULL, received_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), PRIMARY KEY (consumer, message_id)`)
	}
	return nil, fmt.Errorf("-db %q: want postgres or mysql", o.db)
}

// create creates the orders table; on failure it cleans up.
func (b *inboxBenchDB) create(ctx context.Context, columns string) error {
	if _, err := b.db.Exec(ctx, `CREATE TABLE `+b.orders+` (`+columns+`)`); err != nil {
		b.cleanup()
		return err
	}
	return nil
}

// createFloor creates the floor's table; on failure it cleans up.
func (b *inboxBenchDB) createFloor(ctx context.Context, columns string) error {
	if _, err := b.db.Exec(ctx, `CREATE TABLE `+b.floor+` (`+columns+`)`); err != nil {
		b.cleanup()
		return err
	}
	return nil
}

// reset empties the orders, the inbox and the floor's table.
func (b *inboxBenchDB) reset(ctx context.Context) error {
	for _, t := range []string{b.orders, b.d.InboxTable(), b.floor} {
		if _, err := b.db.Exec(ctx, `TRUNCATE TABLE `+t); err != nil {
			return err
		}
	}
	return nil
}

func (b *inboxBenchDB) queryRow(ctx context.Context, q string, dest ...any) error {
	rows, err := b.db.Query(ctx, q)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return fmt.Errorf("%s: no row", q)
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}

type inboxBenchVariant struct {
	middleware message.HandlerMiddleware // nil for none
	handler    message.NoPublishHandlerFunc
}

// run consumes n fresh messages over conc topics and returns messages per
// second, checking that every message left its order row.
func (v inboxBenchVariant) run(ctx context.Context, b *inboxBenchDB, n, conc int) (float64, error) {
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
	if err := b.queryRow(ctx, `SELECT count(*) FROM `+b.orders, &rows); err != nil {
		return 0, err
	}
	if rows < n {
		return 0, fmt.Errorf("%d order rows after %d messages", rows, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}
