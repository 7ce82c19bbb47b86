package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

// payloadBytes is the size of each event: a millbox message's payload, a
// River job's payload string.
const payloadBytes = 256

// orderEvent is the River job that carries the event.
type orderEvent struct {
	OrderID int64  `json:"order_id"`
	Payload string `json:"payload"`
}

// Kind names the job.
func (orderEvent) Kind() string { return "order_event" }

// writeVariant is what a writer does between inserting the order row and
// committing; nil does nothing.
type writeVariant struct {
	name string
	step func(ctx context.Context, tx pgx.Tx, id int64) error
}

// writeRounds splits each variant's time into rounds, rotated among the
// variants, so that drift of the shared machine hits all of them alike.
const writeRounds = 10

func compareWrites(ctx context.Context, b *bench, writers []int, per time.Duration) ([]any, error) {
	// An insert-only client with River's defaults, as an application that
	// inserts in its transactions has one: it notifies each queue at most
	// once per FetchCooldown.
	inserter, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Schema: b.schema})
	if err != nil {
		return nil, err
	}
	payload := make([]byte, payloadBytes)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	variants := []writeVariant{
		{"bare", nil},
		{"millbox", func(ctx context.Context, tx pgx.Tx, id int64) error {
			return publish(tx, b.millbox, id, payload)
		}},
		{"millbox+notify", func(ctx context.Context, tx pgx.Tx, id int64) error {
			return publish(tx, b.notifying, id, payload)
		}},
		{"select1", func(ctx context.Context, tx pgx.Tx, _ int64) error {
			_, err := tx.Exec(ctx, `SELECT 1`)
			return err
		}},
		{"river", func(ctx context.Context, tx pgx.Tx, id int64) error {
			_, err := inserter.InsertTx(ctx, tx, orderEvent{OrderID: id, Payload: string(payload)}, nil)
			return err
		}},
	}
	fmt.Printf("concurrent writers, pgxpool sized to the writers, %v per variant in %d interleaved rounds; ratio = bare tx/s / variant tx/s\n", per, writeRounds)
	var kv []any
	for _, w := range writers {
		rates, err := writeThroughput(ctx, b, w, per, variants)
		if err != nil {
			return nil, err
		}
		for _, v := range variants {
			fmt.Printf("writers %2d  %-15s %8.0f tx/s  ratio %.2f\n", w, v.name, rates[v.name], rates["bare"]/rates[v.name])
		}
		p := strconv.Itoa(w)
		kv = append(kv,
			"write"+p+"_bare_tx_per_s", int(rates["bare"]),
			"write"+p+"_overhead_ratio", rates["bare"]/rates["millbox"],
			"write"+p+"_notify_ratio", rates["bare"]/rates["millbox+notify"],
			"write"+p+"_select1_ratio", rates["bare"]/rates["select1"],
			"write"+p+"_river_ratio", rates["bare"]/rates["river"],
			"river_vs_millbox_write"+p, rates["river"]/rates["millbox"])
	}
	return kv, nil
}

// writeThroughput runs writers concurrent writers on a pool of that many
// connections, each looping BEGIN, insert one order row, the variant's
// step, COMMIT, for per time per variant, and returns each variant's
// committed transactions per second.
func writeThroughput(ctx context.Context, b *bench, writers int, per time.Duration, variants []writeVariant) (map[string]float64, error) {
	cfg, err := pgxpool.ParseConfig(b.url)
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
	insert := `INSERT INTO "` + b.schema + `".orders (id, customer, amount) VALUES ($1, $2, $3)`
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
					if err := writeOne(ctx, pool, insert, b.orderIDs.Add(1), v.step); err != nil {
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

func writeOne(ctx context.Context, pool *pgxpool.Pool, insert string, id int64, step func(context.Context, pgx.Tx, int64) error) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer rollback(tx)
	if _, err := tx.Exec(ctx, insert, id, "c", 100); err != nil {
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

// publish writes one event through a millbox publisher bound to tx, as an
// application does in its transaction.
func publish(tx pgx.Tx, d sqladapters.Dialect, id int64, payload []byte) error {
	pub, err := forwarder.NewPublisher(pgxv5.WrapTx(tx), forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		return err
	}
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, orderKey(id))
	return pub.Publish("orders", msg)
}

func orderKey(id int64) string { return "order-" + strconv.FormatInt(id, 10) }
