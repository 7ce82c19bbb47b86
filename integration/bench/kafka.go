package main

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("forward", "drain N prefilled messages (200 keys, 256 B) to Kafka (kfake; -dest nats or redis for NATS JetStream or Redis streams): millbox vs Watermill's stock forwarder", runForward)
	register("latency", "commit-to-Kafka latency at 1,000 msg/s: millbox vs Watermill's stock forwarder", runLatency)
}

// millboxToKafka prefills n messages into a fresh outbox and times
// o.instances millbox forwarders draining them to a fresh topic, through
// watermill-kafka's publisher or, batching, kafkabatch.
func millboxToKafka(ctx context.Context, o options, k *testenv.Kafka, n int, batching bool) (float64, error) {
	dest := kafkaDest(k.Addrs())
	dest.publisher = func() (message.Publisher, error) { return kafkaPublisher(k, batching) }
	return millboxTo(ctx, o, dest, n)
}

// millboxTo prefills n messages into a fresh outbox and times o.instances
// millbox forwarders draining them to a fresh topic of dest, through one
// publisher they share.
func millboxTo(ctx context.Context, o options, dest benchDest, n int) (float64, error) {
	db, d, cleanup, err := benchOutbox(ctx, o)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return 0, err
	}
	// Fresh statistics, as the database would have them on a live outbox.
	if err := analyze(ctx, db, d, o.db); err != nil {
		return 0, err
	}
	// Rows are written for topic "bench"; each run sends them to a topic
	// of its own, so runs on one broker do not see each other's messages.
	topic := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	col, stop, err := dest.collect(topic)
	if err != nil {
		return 0, err
	}
	defer stop()
	pub, err := dest.publisher()
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	var fs []*forwarder.Forwarder
	for range max(o.instances, 1) {
		f, err := forwarder.New(forwarder.Config{
			DB:          db,
			Dialect:     d,
			Destination: pub,
			BatchSize:   o.batch,
			Concurrency: o.concurrency,
			Topic:       func(string, *message.Message) (string, error) { return topic, nil },
		})
		if err != nil {
			return 0, err
		}
		fs = append(fs, f)
	}
	errc := make(chan error, len(fs))
	start := time.Now()
	for _, f := range fs {
		go func() { errc <- f.Run(ctx) }()
	}
	werr := col.WaitN(ctx, n, 10*time.Minute)
	elapsed := col.LastFirstArrival().Sub(start)
	if werr == nil {
		// A short drain's rate counts the start (leases, the first read,
		// the client's first metadata) as much as the forwarding: say how
		// long the start took and the rate after it.
		first := firstArrival(col)
		fmt.Printf("  first message %v after the start; %.0f msg/s from then\n",
			first.Sub(start).Round(time.Millisecond), float64(n)/col.LastFirstArrival().Sub(first).Seconds())
	}
	for _, f := range fs {
		_ = f.Close()
	}
	for range fs {
		if err := <-errc; err != nil {
			return 0, err
		}
	}
	if werr != nil {
		return 0, werr
	}
	return float64(n) / elapsed.Seconds(), nil
}

// analyze refreshes the outbox's planner statistics.
func analyze(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, dbName string) error {
	stmt := "ANALYZE "
	if dbName == "mysql" {
		stmt = "ANALYZE TABLE "
	}
	rows, err := db.Query(ctx, stmt+d.OutboxTable())
	if err != nil {
		return fmt.Errorf("analyze: %w", err)
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

func runForward(ctx context.Context, o options) error {
	switch o.dest {
	case "kafka":
	case "nats", "redis":
		return runForwardTo(ctx, o)
	default:
		return fmt.Errorf("-dest %q: want kafka, nats or redis", o.dest)
	}
	n := orDefault(o.n, 200000)
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Printf("draining %d messages (200 keys, 256-byte payloads) from %s to Kafka (kfake, 8 partitions), %d millbox forwarder(s)\n", n, o.db, max(o.instances, 1))
	mill, err := millboxToKafka(ctx, o, k, n, false)
	if err != nil {
		return fmt.Errorf("millbox: %w", err)
	}
	fmt.Printf("millbox forwarder, watermill-kafka publisher: %8.0f msg/s\n", mill)
	batch, err := millboxToKafka(ctx, o, k, n, true)
	if err != nil {
		return fmt.Errorf("millbox with kafkabatch: %w", err)
	}
	fmt.Printf("millbox forwarder, kafkabatch publisher:      %8.0f msg/s\n", batch)
	if env("MILLBOX_BENCH_SKIP_STOCK", "") != "" {
		return nil
	}
	stockRun := stockForward
	if o.db == "mysql" {
		stockRun = stockForwardMySQL
	}
	stock, err := stockRun(ctx, map[bool]string{true: o.mysqlDSN, false: o.pgURL}[o.db == "mysql"], k.Addrs(), n, 200, 256)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	fmt.Printf("watermill stock forwarder:                    %8.0f msg/s\n", stock)
	summary("millbox_msgs_per_s", int(mill), "millbox_batch_msgs_per_s", int(batch), "stock_msgs_per_s", int(stock), "ratio", mill/stock)
	return nil
}

// kafkaPublisher returns watermill-kafka's keyed publisher or, batching,
// millbox's kafkabatch publisher, both with the test environment's client
// settings.
func kafkaPublisher(k *testenv.Kafka, batching bool) (message.Publisher, error) {
	if !batching {
		return testenv.NewKafkaPublisher(k.Addrs(), true)
	}
	return kafkabatch.NewPublisher(kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()})
}

// millboxLatency commits rate messages per second for dur through the
// outbox while a forwarder sends them to Kafka, and returns the p50 and
// p99 of commit-to-arrival times.
func millboxLatency(ctx context.Context, o options, k *testenv.Kafka, rate int, dur time.Duration) (p50, p99 time.Duration, err error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	topic := fmt.Sprintf("latency-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return 0, 0, err
	}
	defer col.Close()
	pub, err := testenv.NewKafkaPublisher(k.Addrs(), true)
	if err != nil {
		return 0, 0, err
	}
	defer pub.Close()
	f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub})
	if err != nil {
		return 0, 0, err
	}
	return forwardedLatency(ctx, f, db, d, topic, col.Collection, rate, dur)
}

// forwardedLatency runs f while it commits rate messages per second for
// dur into topic through the outbox of d, and returns the p50 and p99 of
// their commit-to-arrival times at col.
func forwardedLatency(ctx context.Context, f *forwarder.Forwarder, db sqladapters.DB, d sqladapters.Dialect, topic string, col *testenv.Collection, rate int, dur time.Duration) (p50, p99 time.Duration, err error) {
	errc := make(chan error, 1)
	go func() { errc <- f.Run(ctx) }()
	if err := f.Ready(ctx); err != nil {
		return 0, 0, err
	}
	committed, err := produceAtRate(ctx, rate, dur, func(i int) (string, error) {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return "", err
		}
		p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			return "", err
		}
		m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%200))
		if err := p.Publish(topic, m); err != nil {
			sqladapters.Rollback(tx)
			return "", err
		}
		return m.UUID, tx.Commit(ctx)
	})
	if err == nil {
		p50, p99, err = latencies(ctx, col, committed)
	}
	_ = f.Close()
	if rerr := <-errc; err == nil {
		err = rerr
	}
	return p50, p99, err
}

// produceAtRate calls commit rate times per second for dur from a few
// goroutines, and returns each message's commit time by UUID.
func produceAtRate(ctx context.Context, rate int, dur time.Duration, commit func(i int) (string, error)) (map[string]time.Time, error) {
	const workers = 8
	out := map[string]time.Time{}
	var mu sync.Mutex
	var firstErr error
	total := int(float64(rate) * dur.Seconds())
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += workers {
				due := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				if ctx.Err() != nil {
					return
				}
				uuid, err := commit(i)
				now := time.Now()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					out[uuid] = now
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out, firstErr
}

// latencies waits for every committed UUID and returns p50 and p99 of the
// commit-to-arrival times.
func latencies(ctx context.Context, col *testenv.Collection, committed map[string]time.Time) (p50, p99 time.Duration, err error) {
	uuids := make([]string, 0, len(committed))
	for u := range committed {
		uuids = append(uuids, u)
	}
	if err := col.WaitUUIDs(ctx, uuids, 2*time.Minute); err != nil {
		return 0, 0, err
	}
	lat := make([]time.Duration, 0, len(uuids))
	for _, u := range uuids {
		r, _ := col.Get(u)
		lat = append(lat, max(r.Arrived.Sub(committed[u]), 0))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func runLatency(ctx context.Context, o options) error {
	dur := orDefault(o.duration, 20*time.Second)
	const rate = 1000
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Printf("committing %d msg/s for %v, measuring commit -> arrival at a Kafka consumer\n", rate, dur)
	p50, p99, err := millboxLatency(ctx, o, k, rate, dur)
	if err != nil {
		return fmt.Errorf("millbox: %w", err)
	}
	fmt.Printf("millbox:   p50 %6.1f ms  p99 %6.1f ms\n", ms(p50), ms(p99))
	sp50, sp99, err := stockLatency(ctx, o.pgURL, k.Addrs(), rate, dur)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	fmt.Printf("stock:     p50 %6.1f ms  p99 %6.1f ms\n", ms(sp50), ms(sp99))
	summary("p50_ms", ms(p50), "p99_ms", ms(p99), "stock_p50_ms", ms(sp50), "stock_p99_ms", ms(sp99))
	return nil
}

// firstArrival returns when the first message arrived at col.
func firstArrival(col *testenv.Collection) time.Time {
	var first time.Time
	for _, r := range col.FirstDeliveries() {
		if first.IsZero() || r.Arrived.Before(first) {
			first = r.Arrived
		}
	}
	return first
}
