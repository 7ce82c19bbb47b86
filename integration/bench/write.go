package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	register("write", "business transaction with 0, 1 and 10 outbox messages, then tx/s of 1, 8 and 32 concurrent writers, with and without the outbox table (Postgres, pgx)", runWrite)
}

// writersFlag lists the writer counts of the concurrent part of the write
// case; main.go's options hold only the flags every case shares.
var writersFlag = flag.String("writers", "1,8,32", "write: comma-separated counts of concurrent writers (empty = single connection only)")

// runWrite first times one business transaction (insert one order row) on
// one connection, bare, with one outbox message and with ten, interleaving
// the variants in rounds so that drift of the shared machine hits all of
// them alike. Then it measures throughput with concurrent writers, where
// what serializes commits shows.
func runWrite(ctx context.Context, o options) error {
	iters := orDefault(o.n, 3000)
	payload := make([]byte, 256)
	writers, err := parseWriters(*writersFlag)
	if err != nil {
		return err
	}
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer dropSchema(pool, schema)
	d, notifying, err := writeDialects(ctx, pool, schema)
	if err != nil {
		return err
	}
	kv, err := writeSingle(ctx, pool, schema, d, notifying, iters, payload)
	if err != nil {
		return err
	}
	if len(writers) > 0 {
		// Order ids of the concurrent part, above those of writeSingle.
		ids := &atomic.Int64{}
		ids.Store(1 << 40)
		// The outbox without a table writes only where a logical slot
		// could read it: one that nobody reads during the run, dropped
		// after it.
		dropSlot, err := benchSlot(ctx, pool)
		if err != nil {
			return err
		}
		defer dropSlot()
		wvs := []writeVariant{
			{"bare", nil},
			{"millbox", func(ctx context.Context, tx pgx.Tx, id int64) error { return publishN(ctx, tx, d, id, 1, payload) }},
			{"emit", func(ctx context.Context, tx pgx.Tx, id int64) error { return emitN(ctx, tx, d, id, 1, payload) }},
			{"millbox+notify", func(ctx context.Context, tx pgx.Tx, id int64) error {
				return publishN(ctx, tx, notifying, id, 1, payload)
			}},
			{"select1", func(ctx context.Context, tx pgx.Tx, _ int64) error { return selectOne(ctx, tx) }},
			{"row", func(ctx context.Context, tx pgx.Tx, id int64) error {
				return insertRow(ctx, tx, schema, "message_rows", id, payload)
			}},
			{"row+pk", func(ctx context.Context, tx pgx.Tx, id int64) error {
				return insertRow(ctx, tx, schema, "message_rows_pk", id, payload)
			}},
		}
		if err := createRowTable(ctx, pool, schema); err != nil {
			return err
		}
		per := orDefault(o.duration, 3*time.Second)
		fmt.Printf("\nconcurrent writers, pgxpool sized to the writers, %v per variant in %d interleaved rounds; ratio = bare tx/s / variant tx/s\n", per, writeRounds)
		for _, w := range writers {
			rates, err := writeThroughput(ctx, o.pgURL, schema, w, per, ids, wvs)
			if err != nil {
				return err
			}
			for _, v := range wvs {
				fmt.Printf("writers %2d  %-15s %8.0f tx/s  ratio %.2f\n", w, v.name, rates[v.name], rates["bare"]/rates[v.name])
			}
			p := "write" + strconv.Itoa(w)
			kv = append(kv,
				p+"_bare_tx_per_s", int(rates["bare"]),
				p+"_overhead_ratio", rates["bare"]/rates["millbox"],
				p+"_notify_ratio", rates["bare"]/rates["millbox+notify"],
				p+"_emit_ratio", rates["bare"]/rates["emit"],
				p+"_select1_ratio", rates["bare"]/rates["select1"],
				p+"_row_ratio", rates["bare"]/rates["row"],
				p+"_rowpk_ratio", rates["bare"]/rates["row+pk"],
				p+"_vs_row", rates["row"]/rates["millbox"])
		}
	}
	summary(kv...)
	return nil
}

// writeSingle times one business transaction on one connection per
// variant and returns its summary pairs.
func writeSingle(ctx context.Context, pool *pgxpool.Pool, schema string, d, notifying *postgres.Dialect, iters int, payload []byte) ([]any, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	var id int64
	order := func(variant int) (time.Duration, error) {
		msgs, dialect := variant, sqladapters.Dialect(d)
		if variant == notifyVariant {
			msgs, dialect = 1, notifying
		}
		id++
		start := time.Now()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return 0, err
		}
		if err := insertOrder(ctx, tx, schema, id); err != nil {
			return 0, err
		}
		if variant == roundTripVariant {
			if err := selectOne(ctx, tx); err != nil {
				return 0, err
			}
		} else if msgs > 0 {
			if err := publishN(ctx, tx, dialect, id, msgs, payload); err != nil {
				return 0, err
			}
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, err
		}
		return time.Since(start), nil
	}
	variants := []int{0, 1, 10, notifyVariant, roundTripVariant}
	times := map[int][]time.Duration{}
	// Warm up statement caches and the table.
	for _, v := range variants {
		for range 50 {
			if _, err := order(v); err != nil {
				return nil, err
			}
		}
	}
	const round = 100
	for done := 0; done < iters; done += round {
		for _, v := range variants {
			for range round {
				dt, err := order(v)
				if err != nil {
					return nil, err
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
		case notifyVariant:
			name = "1 message, NOTIFY"
		case roundTripVariant:
			name = "SELECT 1 instead"
		}
		fmt.Printf("%-22s median %8v  p90 %8v  ratio %.2f  (%d transactions)\n", name, med[v], times[v][len(times[v])*9/10],
			float64(med[v])/float64(med[0]), len(times[v]))
	}
	return []any{
		"write_overhead_ratio", float64(med[1]) / float64(med[0]),
		"write10_overhead_ratio", float64(med[10]) / float64(med[0]),
		"write_notify_ratio", float64(med[notifyVariant]) / float64(med[0]),
	}, nil
}

// notifyVariant marks the single-connection variant with one message
// through a dialect that calls pg_notify; roundTripVariant the one that
// runs SELECT 1 instead of publishing, the cost of any extra statement in
// the transaction.
const (
	notifyVariant    = -1
	roundTripVariant = -2
)

// writeDialects migrates the outbox in schema, creates the orders table
// and returns the dialect with default options and one with Notify, both
// on the same table.
func writeDialects(ctx context.Context, pool *pgxpool.Pool, schema string) (*postgres.Dialect, *postgres.Dialect, error) {
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return nil, nil, err
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), d); err != nil {
		return nil, nil, err
	}
	notifying, err := postgres.New(postgres.Options{Schema: schema, Notify: true})
	if err != nil {
		return nil, nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".orders (id bigint PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return nil, nil, err
	}
	return d, notifying, nil
}

func insertOrder(ctx context.Context, tx pgx.Tx, schema string, id int64) error {
	_, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".orders (id, customer, amount) VALUES ($1, $2, $3)`, id, "c", 100)
	return err
}

// selectOne is the floor of any extra statement: one round trip.
// createRowTable creates a table of the outbox's columns with no index, no
// key and no defaults to compute: inserting the same message row there is
// the floor of storing a message at all (heap and WAL), against which the
// outbox insert's own cost (identity, indexes, defaults) shows. A second
// table adds the outbox's identity primary key and nothing else, which
// splits that cost between the primary key and the pending index.
func createRowTable(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, err := pool.Exec(ctx, `CREATE TABLE "`+schema+`".message_rows (
	topic text, uuid text, payload bytea, metadata jsonb, key text, key_hash integer)`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE "`+schema+`".message_rows_pk (
	id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	topic text, uuid text, payload bytea, metadata jsonb, key text, key_hash integer)`)
	return err
}

func insertRow(ctx context.Context, tx pgx.Tx, schema, table string, id int64, payload []byte) error {
	_, err := tx.Exec(ctx, `INSERT INTO "`+schema+`".`+table+` (topic, uuid, payload, metadata, key, key_hash)
	VALUES ('orders', $1, $2, '{"partition_key":"order"}', $3, 1)`, strconv.FormatInt(id, 10), payload, "key-"+strconv.FormatInt(id%100, 10))
	return err
}

func selectOne(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `SELECT 1`)
	return err
}

func parseWriters(s string) ([]int, error) {
	var ws []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		w, err := strconv.Atoi(f)
		if err != nil || w < 1 {
			return nil, fmt.Errorf("-writers %q: want positive counts separated by commas", s)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// writeVariant is what a concurrent writer does between inserting the
// order row and committing; nil does nothing.
type writeVariant struct {
	name string
	step func(ctx context.Context, tx pgx.Tx, id int64) error
}

// writeRounds splits each variant's time into rounds, rotated among the
// variants, so that drift of the shared machine hits all of them alike.
const writeRounds = 10

// writeThroughput runs writers concurrent writers on a pool of that many
// connections, each looping BEGIN, insert one order row, the variant's
// step, COMMIT, for per time per variant, and returns each variant's
// committed transactions per second.
func writeThroughput(ctx context.Context, url, schema string, writers int, per time.Duration, ids *atomic.Int64, variants []writeVariant) (map[string]float64, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(writers)
	cfg.MinConns = int32(writers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	run := func(v writeVariant, d time.Duration) (int64, time.Duration, error) {
		var (
			stop      atomic.Bool
			committed atomic.Int64
			wg        sync.WaitGroup
			errOnce   sync.Once
			firstErr  error
		)
		start := time.Now()
		for range writers {
			wg.Go(func() {
				for !stop.Load() && ctx.Err() == nil {
					if err := writeOne(ctx, pool, schema, ids.Add(1), v.step); err != nil {
						errOnce.Do(func() { firstErr = err })
						stop.Store(true)
						return
					}
					committed.Add(1)
				}
			})
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		stop.Store(true)
		wg.Wait()
		if firstErr == nil {
			firstErr = ctx.Err()
		}
		return committed.Load(), time.Since(start), firstErr
	}
	// Warm up: open every connection and prepare every statement.
	for _, v := range variants {
		if _, _, err := run(v, 200*time.Millisecond); err != nil {
			return nil, fmt.Errorf("%d writers, %s: %w", writers, v.name, err)
		}
	}
	count := map[string]int64{}
	elapsed := map[string]time.Duration{}
	for r := range writeRounds {
		for i := range variants {
			v := variants[(i+r)%len(variants)]
			n, dt, err := run(v, per/writeRounds)
			if err != nil {
				return nil, fmt.Errorf("%d writers, %s: %w", writers, v.name, err)
			}
			count[v.name] += n
			elapsed[v.name] += dt
		}
	}
	rates := map[string]float64{}
	for _, v := range variants {
		rates[v.name] = float64(count[v.name]) / elapsed[v.name].Seconds()
	}
	return rates, nil
}

func writeOne(ctx context.Context, pool *pgxpool.Pool, schema string, id int64, step func(context.Context, pgx.Tx, int64) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer rollback(tx)
	if err := insertOrder(ctx, tx, schema, id); err != nil {
		return err
	}
	if step != nil {
		if err := step(ctx, tx, id); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// rollback ends tx if Commit was not reached, under a context of its own
// so that a cancelled run leaves no transaction open.
func rollback(tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}

// publishers holds one publisher per dialect and mode, made once, as an
// application makes it at start.
var publishers sync.Map // publisherKey → *forwarder.Publisher

type publisherKey struct {
	d            sqladapters.Dialect
	withoutTable bool
}

// publishN publishes n messages of the order's key in tx with PublishTx.
func publishN(ctx context.Context, tx pgx.Tx, d sqladapters.Dialect, id int64, n int, payload []byte) error {
	return publishTo(ctx, tx, publisherKey{d: d}, id, n, payload)
}

// emitN publishes n messages of the order's key in tx with PublishTx of a
// publisher without a table.
func emitN(ctx context.Context, tx pgx.Tx, d sqladapters.Dialect, id int64, n int, payload []byte) error {
	return publishTo(ctx, tx, publisherKey{d: d, withoutTable: true}, id, n, payload)
}

func publishTo(ctx context.Context, tx pgx.Tx, k publisherKey, id int64, n int, payload []byte) error {
	p, ok := publishers.Load(k)
	if !ok {
		pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: k.d, WithoutTable: k.withoutTable, Slot: "*"})
		if err != nil {
			return err
		}
		p, _ = publishers.LoadOrStore(k, pub)
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
		msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, "order-"+strconv.FormatInt(id, 10))
	}
	return p.(*forwarder.Publisher).PublishTx(ctx, pgxv5.WrapTx(tx), "orders", msgs...)
}

// benchSlot creates a logical replication slot of its own and returns
// its drop.
func benchSlot(ctx context.Context, pool *pgxpool.Pool) (func(), error) {
	slot := fmt.Sprintf("mbbench_%d", time.Now().UnixNano())
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot); err != nil {
		return nil, fmt.Errorf("create a logical replication slot for the outbox without a table (needs wal_level = logical): %w", err)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
	}, nil
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
