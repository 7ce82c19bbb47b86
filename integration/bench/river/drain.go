package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

// perTx is how many events one prefill transaction writes.
const perTx = 5000

// compareDrains prefills n events into each outbox, then drains millbox's
// with its forwarder and River's with its workers, both into a publisher
// that drops messages, and returns the summary pairs.
func compareDrains(ctx context.Context, b *bench, n int) ([]any, error) {
	payload := make([]byte, payloadBytes)
	for i := range payload {
		payload[i] = byte('a' + i%26)
	}
	millDest, riverDest := newCounting(n), newCounting(n)
	workers := river.NewWorkers()
	river.AddWorker(workers, &publishWorker{pub: riverDest})
	client, err := river.NewClient(riverpgxv5.New(b.pool), riverTuned(b.schema, workers, riverBenchWorkers))
	if err != nil {
		return nil, err
	}
	// Start from empty tables: the write comparison left rows in both.
	if _, err := b.pool.Exec(ctx, `TRUNCATE `+b.millbox.OutboxTable()+`, "`+b.schema+`".river_job`); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := prefillMillbox(ctx, b, n, payload); err != nil {
		return nil, err
	}
	fmt.Printf("\nprefilled %d millbox messages in %v\n", n, time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if err := prefillRiver(ctx, client, n, string(payload)); err != nil {
		return nil, err
	}
	fmt.Printf("prefilled %d River jobs in %v\n", n, time.Since(start).Round(time.Millisecond))
	// Fresh statistics, as autovacuum would have them on a live table.
	if _, err := b.pool.Exec(ctx, `ANALYZE `+b.millbox.OutboxTable()+`; ANALYZE "`+b.schema+`".river_job`); err != nil {
		return nil, err
	}

	mill, err := drainMillbox(ctx, b, n, millDest)
	if err != nil {
		return nil, err
	}
	riv, err := drainRiver(ctx, client, n)
	if err != nil {
		return nil, err
	}
	if got := riverDest.n.Load(); got < int64(n) {
		return nil, fmt.Errorf("river workers published %d of %d events", got, n)
	}
	fmt.Printf("drain of %d events to a no-op publisher, until every row is settled: millbox %.0f msgs/s, River %.0f msgs/s\n", n, mill, riv)
	return []any{
		"millbox_drain_msgs_per_s", int(mill),
		"river_drain_msgs_per_s", int(riv),
		"river_vs_millbox_drain", riv / mill,
	}, nil
}

// prefillMillbox commits n messages through the millbox publisher, each
// with an ordering key of its own, as the writers of the write comparison
// produce them.
func prefillMillbox(ctx context.Context, b *bench, n int, payload []byte) error {
	for done := 0; done < n; done += perTx {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			return err
		}
		pub, err := forwarder.NewPublisher(pgxv5.WrapTx(tx), forwarder.PublisherConfig{Dialect: b.millbox})
		if err != nil {
			rollback(tx)
			return err
		}
		msgs := make([]*message.Message, 0, perTx)
		for i := done; i < min(done+perTx, n); i++ {
			m := message.NewMessage(watermill.NewUUID(), payload)
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, orderKey(int64(i)))
			msgs = append(msgs, m)
		}
		if err := pub.Publish("orders", msgs...); err != nil {
			rollback(tx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

// prefillRiver inserts n jobs with River's fastest bulk insert.
func prefillRiver(ctx context.Context, client *river.Client[pgx.Tx], n int, payload string) error {
	for done := 0; done < n; done += perTx {
		params := make([]river.InsertManyParams, 0, perTx)
		for i := done; i < min(done+perTx, n); i++ {
			params = append(params, river.InsertManyParams{Args: orderEvent{OrderID: int64(i), Payload: payload}})
		}
		if _, err := client.InsertManyFast(ctx, params); err != nil {
			return err
		}
	}
	return nil
}

// drainMillbox runs a forwarder with default settings until dest has seen
// n messages and Close has flushed the deletes, and returns the rate.
func drainMillbox(ctx context.Context, b *bench, n int, dest *countingPublisher) (float64, error) {
	f, err := forwarder.New(forwarder.Config{DB: pgxv5.WrapPool(b.pool), Dialect: b.millbox, Destination: dest})
	if err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	select {
	case <-dest.all:
	case err := <-errc:
		return 0, fmt.Errorf("forwarder stopped: %v", err)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	elapsed := time.Since(start)
	if err := <-errc; err != nil {
		return 0, err
	}
	var left int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM `+b.millbox.OutboxTable()).Scan(&left); err != nil {
		return 0, err
	}
	if left > 0 {
		return 0, fmt.Errorf("millbox forwarder left %d rows in the outbox", left)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// drainRiver starts the client's workers and counts completed jobs, which
// River reports once its completer has recorded them, and returns the
// rate.
func drainRiver(ctx context.Context, client *river.Client[pgx.Tx], n int) (float64, error) {
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: n, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	for done := 0; done < n; {
		select {
		case ev := <-events:
			if ev == nil {
				return 0, fmt.Errorf("river subscription closed after %d of %d jobs", done, n)
			}
			done++
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	stopCtx, stop := context.WithTimeout(context.Background(), time.Minute)
	defer stop()
	if err := client.Stop(stopCtx); err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// publishWorker publishes each job's event, as the worker of an outbox
// built on River does.
type publishWorker struct {
	river.WorkerDefaults[orderEvent]
	pub message.Publisher
}

func (w *publishWorker) Work(_ context.Context, job *river.Job[orderEvent]) error {
	msg := message.NewMessage(watermill.NewUUID(), []byte(job.Args.Payload))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, orderKey(job.Args.OrderID))
	return w.pub.Publish("orders", msg)
}

// River's own benchmark (riverbench, in River's command-line module) tunes
// its client for throughput with these values; River's defaults
// (FetchCooldown 100ms, FetchPollInterval 1s, 100 workers in the examples)
// drain far slower.
const (
	riverBenchFetchCooldown     = 2 * time.Millisecond
	riverBenchFetchPollInterval = 20 * time.Millisecond
	riverBenchWorkers           = 2000
)

// riverTuned returns a client config tuned as River's benchmark tunes it,
// with maxWorkers workers on the default queue.
func riverTuned(schema string, workers *river.Workers, maxWorkers int) *river.Config {
	return &river.Config{
		Schema:            schema,
		FetchCooldown:     riverBenchFetchCooldown,
		FetchPollInterval: riverBenchFetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// countingPublisher drops messages and counts them.
type countingPublisher struct {
	n    atomic.Int64
	once sync.Once
	all  chan struct{} // closed once want messages arrived
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
