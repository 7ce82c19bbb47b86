package main

import (
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	wmforwarder "github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/integration/testenv"
)

// Watermill's stock outbox, the baseline millbox is measured against:
// watermill-sql/v4's default schema and offsets adapter hold the envelopes
// that components/forwarder's Publisher writes inside the business
// transaction; components/forwarder's Forwarder reads them with a
// watermill-sql subscriber and publishes each to Kafka with watermill-kafka
// v3, keyed by the message's partition_key as millbox's benchmarks are.
// The setup follows Watermill's forwarder documentation and example; the
// only deviations are table names (a fresh schema or topic per run) and the
// batch size where a variant says so.

func init() {
	register("stock", "Watermill's stock outbox (watermill-sql/v4 → components/forwarder → watermill-kafka/v3), Postgres and MySQL: the baseline", runStock)
}

// commitTSField is the metadata field carrying, as Unix nanoseconds, the
// moment the producing transaction wrote the message (just before its
// commit); latency is arrival at the Kafka collector minus this.
const commitTSField = "commit_ts"

const (
	stockKeys        = 100
	stockPayloadSize = 256
	stockPrefillTx   = 1000 // messages per pre-fill transaction
)

func runStock(ctx context.Context, o options) error {
	n := orDefault(o.n, 20000)
	duration := orDefault(o.duration, 10*time.Second)
	const rate = 500
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	addrs := k.Addrs()

	pg, err := stockForward(ctx, o.pgURL, addrs, n, stockKeys, stockPayloadSize)
	if err != nil {
		return fmt.Errorf("postgres default: %w", err)
	}
	fmt.Printf("postgres, default settings:     %8.0f msg/s  (%d messages, %d keys)\n", pg, n, stockKeys)
	pgBatch, err := stockForwardBatch(ctx, o.pgURL, addrs, n, stockKeys, stockPayloadSize, 1000)
	if err != nil {
		return fmt.Errorf("postgres batch 1000: %w", err)
	}
	fmt.Printf("postgres, subscribe batch 1000: %8.0f msg/s\n", pgBatch)
	my, err := stockForwardMySQL(ctx, o.mysqlDSN, addrs, n, stockKeys, stockPayloadSize)
	if err != nil {
		return fmt.Errorf("mysql default: %w", err)
	}
	fmt.Printf("mysql, default settings:        %8.0f msg/s\n", my)
	myBatch, err := stockForwardMySQLBatch(ctx, o.mysqlDSN, addrs, n, stockKeys, stockPayloadSize, 1000)
	if err != nil {
		return fmt.Errorf("mysql batch 1000: %w", err)
	}
	fmt.Printf("mysql, subscribe batch 1000:    %8.0f msg/s\n", myBatch)
	p50, p99, err := stockLatency(ctx, o.pgURL, addrs, rate, duration)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	fmt.Printf("postgres latency at %d msg/s for %v: p50 %v  p99 %v\n", rate, duration, p50.Round(time.Millisecond), p99.Round(time.Millisecond))
	summary(
		"stock_pg_msgs_per_sec", pg,
		"stock_pg_batch1000_msgs_per_sec", pgBatch,
		"stock_mysql_msgs_per_sec", my,
		"stock_mysql_batch1000_msgs_per_sec", myBatch,
		"stock_latency_p50_ms", float64(p50.Microseconds())/1000,
		"stock_latency_p99_ms", float64(p99.Microseconds())/1000,
	)
	return nil
}

// stockForward pre-fills n messages (keys distinct partition_key values,
// payloadSize bytes each) into the stock Postgres outbox, then starts the
// stock forwarder with default settings and returns n divided by the time
// until the last of them arrived at Kafka.
func stockForward(ctx context.Context, pgURL string, kafkaAddrs []string, n, keys, payloadSize int) (float64, error) {
	return stockForwardBatch(ctx, pgURL, kafkaAddrs, n, keys, payloadSize, 0)
}

// stockForwardBatch is stockForward with the subscriber reading batch rows
// per query (DefaultPostgreSQLSchema.SubscribeBatchSize; 0 = its default,
// 100). The forwarder still publishes one message at a time.
func stockForwardBatch(ctx context.Context, pgURL string, kafkaAddrs []string, n, keys, payloadSize, batch int) (float64, error) {
	return stockForwardTo(ctx, "postgres", pgURL, kafkaDest(kafkaAddrs), n, keys, payloadSize, batch)
}

// stockForwardTo is stockForwardBatch on db ("postgres" or "mysql", at
// url) to any destination.
func stockForwardTo(ctx context.Context, db, url string, dest benchDest, n, keys, payloadSize, batch int) (float64, error) {
	newOutbox := newStockPostgres
	if db == "mysql" {
		newOutbox = newStockMySQL
	}
	o, err := newOutbox(ctx, url, batch)
	if err != nil {
		return 0, err
	}
	defer o.close()
	return o.forward(ctx, dest, n, keys, payloadSize)
}

// stockForwardMySQL is stockForward on MySQL/MariaDB (DefaultMySQLSchema,
// DefaultMySQLOffsetsAdapter, go-sql-driver/mysql).
func stockForwardMySQL(ctx context.Context, dsn string, kafkaAddrs []string, n, keys, payloadSize int) (float64, error) {
	return stockForwardMySQLBatch(ctx, dsn, kafkaAddrs, n, keys, payloadSize, 0)
}

// stockForwardMySQLBatch is stockForwardMySQL with DefaultMySQLSchema's
// SubscribeBatchSize set to batch (0 = its default, 100).
func stockForwardMySQLBatch(ctx context.Context, dsn string, kafkaAddrs []string, n, keys, payloadSize, batch int) (float64, error) {
	return stockForwardTo(ctx, "mysql", dsn, kafkaDest(kafkaAddrs), n, keys, payloadSize, batch)
}

// stockLatency runs the stock Postgres outbox with default settings while
// producers commit rate single-message transactions per second for
// duration, and returns the median and 99th percentile of commit → arrival
// at a Kafka consumer.
func stockLatency(ctx context.Context, pgURL string, kafkaAddrs []string, rate int, duration time.Duration) (p50, p99 time.Duration, err error) {
	o, err := newStockPostgres(ctx, pgURL, 0)
	if err != nil {
		return 0, 0, err
	}
	defer o.close()
	run, err := o.start(kafkaDest(kafkaAddrs))
	if err != nil {
		return 0, 0, err
	}
	defer run.stop()

	payload := stockPayload(stockPayloadSize)
	total := int(float64(rate) * duration.Seconds())
	slots := make(chan int)
	go func() {
		defer close(slots)
		start := time.Now()
		for i := range total {
			if d := time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(rate))); d > 0 {
				time.Sleep(d)
			}
			select {
			case slots <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		sent    int
		prodErr error
	)
	for range 8 {
		wg.Go(func() {
			for i := range slots {
				m := stockMessage(i, stockKeys, payload)
				m.Metadata.Set(commitTSField, strconv.FormatInt(time.Now().UnixNano(), 10))
				err := o.inTx(ctx, func(pub message.Publisher) error { return pub.Publish(run.dest, m) })
				mu.Lock()
				if err != nil {
					prodErr = errors.Join(prodErr, err)
				} else {
					sent++
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	if prodErr != nil {
		return 0, 0, prodErr
	}
	if err := run.wait(ctx, sent); err != nil {
		return 0, 0, err
	}
	lat, err := commitLatencies(run.col.FirstDeliveries())
	if err != nil {
		return 0, 0, err
	}
	return percentile(lat, 50), percentile(lat, 99), nil
}

// commitLatencies returns arrival minus commitTSField for each record.
func commitLatencies(recs []testenv.Record) ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(recs))
	for _, r := range recs {
		ns, err := strconv.ParseInt(r.Metadata[commitTSField], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("message %s: no %s metadata", r.UUID, commitTSField)
		}
		out = append(out, r.Arrived.Sub(time.Unix(0, ns)))
	}
	slices.Sort(out)
	return out, nil
}

// percentile returns the p-th percentile of sorted durations.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// stockOutbox is one stock outbox: a forwarder topic whose tables live in a
// place of their own, and the way to write into it inside a transaction.
type stockOutbox struct {
	fwdTopic string
	db       wsql.Beginner
	schema   wsql.SchemaAdapter
	offsets  wsql.OffsetsAdapter
	// inTx runs fn with a publisher bound to a new transaction and commits
	// it when fn succeeds.
	inTx  func(ctx context.Context, fn func(message.Publisher) error) error
	close func()
}

func newStockPostgres(ctx context.Context, url string, batch int) (*stockOutbox, error) {
	pool, schema, err := benchPostgres(ctx, url)
	if err != nil {
		return nil, err
	}
	// The default adapters with their default table names, qualified by
	// the run's own schema.
	sa := wsql.DefaultPostgreSQLSchema{
		GenerateMessagesTableName: func(topic string) string { return `"` + schema + `"."watermill_` + topic + `"` },
		SubscribeBatchSize:        batch,
	}
	oa := wsql.DefaultPostgreSQLOffsetsAdapter{
		GenerateMessagesOffsetsTableName: func(topic string) string {
			return `"` + schema + `"."watermill_offsets_` + topic + `"`
		},
	}
	o := &stockOutbox{
		fwdTopic: "outbox",
		db:       wsql.BeginnerFromPgx(pool),
		schema:   sa,
		offsets:  oa,
		close:    func() { dropSchema(pool, schema) },
	}
	o.inTx = func(ctx context.Context, fn func(message.Publisher) error) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		// Commit and roll back on the pgx transaction itself: the wrapper
		// from TxFromPgx has no context and its Rollback panics.
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: sa}, nil)
		if err == nil {
			err = fn(wmforwarder.NewPublisher(pub, wmforwarder.PublisherConfig{ForwarderTopic: o.fwdTopic}))
		}
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = tx.Rollback(rctx)
			return err
		}
		return tx.Commit(ctx)
	}
	return o, nil
}

func newStockMySQL(ctx context.Context, dsn string, batch int) (*stockOutbox, error) {
	db, err := stdsql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("mysql unreachable: %w", err)
	}
	// MySQL has no schemas to drop: the run's tables carry a unique topic.
	topic := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	sa := wsql.DefaultMySQLSchema{SubscribeBatchSize: batch}
	oa := wsql.DefaultMySQLOffsetsAdapter{}
	o := &stockOutbox{
		fwdTopic: topic,
		db:       wsql.BeginnerFromStdSQL(db),
		schema:   sa,
		offsets:  oa,
		close: func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = db.ExecContext(cctx, "DROP TABLE IF EXISTS "+sa.MessagesTable(topic)+", "+oa.MessagesOffsetsTable(topic))
			_ = db.Close()
		},
	}
	o.inTx = func(ctx context.Context, fn func(message.Publisher) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		pub, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: sa}, nil)
		if err == nil {
			err = fn(wmforwarder.NewPublisher(pub, wmforwarder.PublisherConfig{ForwarderTopic: o.fwdTopic}))
		}
		if err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return o, nil
}

func (o *stockOutbox) subscriber() (*wsql.Subscriber, error) {
	sub, err := wsql.NewSubscriber(o.db, wsql.SubscriberConfig{
		SchemaAdapter:    o.schema,
		OffsetsAdapter:   o.offsets,
		InitializeSchema: true,
	}, nil)
	if err != nil {
		return nil, err
	}
	if err := sub.SubscribeInitialize(o.fwdTopic); err != nil {
		_ = sub.Close()
		return nil, err
	}
	return sub, nil
}

// forward pre-fills n messages, then runs the forwarder until all of them
// reached dest, and returns the rate measured from the forwarder's start.
func (o *stockOutbox) forward(ctx context.Context, dest benchDest, n, keys, payloadSize int) (float64, error) {
	// The tables must exist before the pre-fill: create them as the
	// subscriber would, with a subscriber that is then dropped.
	sub, err := o.subscriber()
	if err != nil {
		return 0, err
	}
	_ = sub.Close()

	topic := testenv.UniqueName("stock_")
	payload := stockPayload(payloadSize)
	fillStart := time.Now()
	for first := 0; first < n; first += stockPrefillTx {
		msgs := make([]*message.Message, 0, stockPrefillTx)
		for i := first; i < min(n, first+stockPrefillTx); i++ {
			msgs = append(msgs, stockMessage(i, keys, payload))
		}
		if err := o.inTx(ctx, func(pub message.Publisher) error { return pub.Publish(topic, msgs...) }); err != nil {
			return 0, fmt.Errorf("pre-fill: %w", err)
		}
	}
	fmt.Printf("  pre-filled %d messages in %v\n", n, time.Since(fillStart).Round(time.Millisecond))

	run, err := o.startTo(dest, topic)
	if err != nil {
		return 0, err
	}
	defer run.stop()
	stopProgress := run.progress(5 * time.Second)
	err = run.wait(ctx, n)
	stopProgress()
	if err != nil {
		return 0, err
	}
	elapsed := run.col.LastFirstArrival().Sub(run.started)
	if d := run.col.Duplicates(); d > 0 {
		fmt.Printf("  %d duplicate deliveries\n", d)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// benchDest is the broker a forwarding run sends messages to.
type benchDest struct {
	// publisher returns a new publisher to the broker.
	publisher func() (message.Publisher, error)
	// collect makes topic ready to receive (creating it where the broker
	// needs that) and starts a collector on it; stop closes the collector
	// and removes topic.
	collect func(topic string) (col *testenv.Collection, stop func(), err error)
}

// kafkaDest is Kafka at addrs, with watermill-kafka's keyed publisher.
func kafkaDest(addrs []string) benchDest {
	return benchDest{
		publisher: func() (message.Publisher, error) { return testenv.NewKafkaPublisher(addrs, true) },
		collect: func(topic string) (*testenv.Collection, func(), error) {
			col, err := testenv.NewKafkaCollector(addrs, topic)
			if err != nil {
				return nil, nil, err
			}
			return col.Collection, func() {
				col.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = testenv.DeleteKafkaTopics(ctx, addrs, topic)
			}, nil
		},
	}
}

// stockRun is a running stock forwarder and a collector on its destination.
type stockRun struct {
	dest    string
	col     *testenv.Collection
	stopCol func()
	fwd     *wmforwarder.Forwarder
	pub     message.Publisher
	started time.Time
	runErr  chan error
	cancel  context.CancelFunc
}

func (o *stockOutbox) start(dest benchDest) (*stockRun, error) {
	return o.startTo(dest, testenv.UniqueName("stock_"))
}

// startTo starts a collector on topic of dest and the forwarder, and
// returns once the forwarder's router runs.
func (o *stockOutbox) startTo(dest benchDest, topic string) (_ *stockRun, err error) {
	r := &stockRun{dest: topic, runErr: make(chan error, 1)}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	if r.col, r.stopCol, err = dest.collect(topic); err != nil {
		return nil, err
	}
	if r.pub, err = dest.publisher(); err != nil {
		return nil, err
	}
	sub, err := o.subscriber()
	if err != nil {
		return nil, err
	}
	r.fwd, err = wmforwarder.NewForwarder(sub, r.pub, watermill.NopLogger{}, wmforwarder.Config{ForwarderTopic: o.fwdTopic})
	if err != nil {
		_ = sub.Close()
		return nil, err
	}
	var runCtx context.Context
	runCtx, r.cancel = context.WithCancel(context.Background())
	r.started = time.Now()
	go func() { r.runErr <- r.fwd.Run(runCtx) }()
	select {
	case <-r.fwd.Running():
		return r, nil
	case err := <-r.runErr:
		r.runErr <- err
		return nil, fmt.Errorf("forwarder stopped at start: %w", err)
	}
}

// wait waits until n distinct messages arrived, failing early if the
// forwarder stops.
func (r *stockRun) wait(ctx context.Context, n int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := make(chan error, 1)
	go func() {
		select {
		case err := <-r.runErr:
			stopped <- err
			r.runErr <- err
			cancel()
		case <-ctx.Done():
		}
	}()
	// Generous: the stock path does a few thousand messages per second.
	timeout := 2*time.Minute + time.Duration(n)*time.Millisecond
	if err := r.col.WaitN(ctx, n, timeout); err != nil {
		select {
		case runErr := <-stopped:
			return fmt.Errorf("forwarder stopped (%v): %w", runErr, err)
		default:
			return err
		}
	}
	return nil
}

// progress prints how many messages arrived every interval, so that a long
// run shows whether it stalls or crawls, until the returned func is called.
func (r *stockRun) progress(interval time.Duration) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(interval)
		defer t.Stop()
		last := 0
		for {
			select {
			case <-done:
				return
			case <-t.C:
				got := r.col.Distinct()
				fmt.Printf("  %6.0fs: %d arrived (%.0f msg/s in the last %v)\n", time.Since(r.started).Seconds(), got, float64(got-last)/interval.Seconds(), interval)
				last = got
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (r *stockRun) stop() {
	if r.fwd != nil {
		_ = r.fwd.Close()
		if r.cancel != nil {
			r.cancel()
			<-r.runErr
		}
	}
	if r.pub != nil {
		_ = r.pub.Close()
	}
	if r.stopCol != nil {
		r.stopCol()
	}
}

func stockPayload(size int) []byte {
	p := make([]byte, size)
	for i := range p {
		p[i] = 'a' + byte(i%26)
	}
	return p
}

// stockMessage is message i of a run: key i%keys, seq i/keys within it.
func stockMessage(i, keys int, payload []byte) *message.Message {
	m := message.NewMessage(watermill.NewUUID(), payload)
	m.Metadata.Set(testenv.KeyMetadataField, "key-"+strconv.Itoa(i%keys))
	m.Metadata.Set("seq", strconv.Itoa(i/keys))
	return m
}
