package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// outagePlan is the shape of a broker outage test: a keyed stream of
// messages at a steady rate, with the broker down for a while in the
// middle of it. MILLBOX_LONG=1 selects the long version.
type outagePlan struct {
	messages int           // messages in the stream
	rate     int           // messages per second
	keys     int           // ordering keys
	outage   time.Duration // how long the broker stays down
	wait     time.Duration // bound on waiting for the deliveries
}

func planOutage() outagePlan {
	if os.Getenv("MILLBOX_LONG") == "1" {
		return outagePlan{messages: 30000, rate: 500, keys: 50, outage: 20 * time.Second, wait: 5 * time.Minute}
	}
	return outagePlan{messages: 4000, rate: 1000, keys: 50, outage: 3 * time.Second, wait: 2 * time.Minute}
}

// maxPendingReadsDown bounds the forwarder's reads of pending rows while
// the destination is down: a few probes, whatever the outage length and
// the backlog.
const maxPendingReadsDown = 10

// brokerControl stops and restarts the destination broker.
type brokerControl struct {
	stop    func(t *testing.T)
	restart func(t *testing.T)
}

func kafkaControl(k *testenv.Kafka) brokerControl {
	return brokerControl{
		stop: func(*testing.T) { k.Stop() },
		restart: func(t *testing.T) {
			if err := k.Restart(); err != nil {
				t.Fatalf("restart Kafka: %v", err)
			}
		},
	}
}

func rabbitControl() brokerControl {
	return brokerControl{
		stop: func(t *testing.T) { testenv.StopRabbitMQ(t) },
		restart: func(t *testing.T) {
			if err := testenv.StartRabbitMQ(); err != nil {
				t.Fatal(err)
			}
		},
	}
}

// TestOutageKafkaBatchPublisher produces keyed calls through kafkabatch
// without a pause while the broker is stopped and restarted on the same
// port, retrying each key as the forwarder does (from the first message
// not delivered). For every key the first deliveries are in order, every
// message of a call that returned nil and of a PartialError's prefix is
// delivered, and every failure says the broker was unavailable.
func TestOutageKafkaBatchPublisher(t *testing.T) {
	plan := planOutage()
	k := testenv.StartKafka(t, "outage-batch")
	col := k.Collect(t, "outage-batch")
	// A DeliveryTimeout shorter than the outage makes calls fail while
	// the broker is down, instead of waiting for it.
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{
		Brokers:         k.Addrs(),
		DeliveryTimeout: time.Second,
		Options:         testenv.KgoProducerOptions(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	stats := publishThroughOutage(t, plan, pub, "outage-batch", col.Collection, kafkaControl(k))
	if stats.failed == 0 {
		t.Fatalf("no call failed during a %v outage with a 1s DeliveryTimeout: %+v", plan.outage, stats)
	}
}

// TestOutageAMQPBatchPublisher is TestOutageKafkaBatchPublisher for
// amqpbatch, with RabbitMQ stopped and started. It runs only when
// MILLBOX_BROKER_RESTARTS=1.
func TestOutageAMQPBatchPublisher(t *testing.T) {
	testenv.RequireBrokerRestarts(t)
	plan := planOutage()
	queue := testenv.AMQPQueue(t)
	col := testenv.CollectAMQPAcrossRestarts(t, queue)
	pub, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: testenv.RequireAMQP(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	stats := publishThroughOutage(t, plan, pub, queue, col.Collection, rabbitControl())
	if stats.failed == 0 {
		t.Fatalf("no call failed while RabbitMQ was stopped: %+v", stats)
	}
}

// callStats counts the outcomes of Publish calls.
type callStats struct {
	calls, ok, partial, failed int
	delivered                  int
}

// publishThroughOutage drives pub with 10 keys, one goroutine each, each
// sending calls of 1–20 messages (its unsent backlog plus new ones) until
// the broker was stopped, restarted and every key got 10 calls through
// again; then it checks what arrived in col.
func publishThroughOutage(t *testing.T, plan outagePlan, pub message.Publisher, topic string, col *testenv.Collection, broker brokerControl) callStats {
	const keys = 10
	ctx := testenv.Ctx(t, plan.wait+plan.outage)
	var (
		mu        sync.Mutex
		stats     callStats
		acked     []string // UUIDs the publisher reported delivered
		wrongErrs []string // failures not classified as the broker's
		firstErr  error
	)
	var phase atomic.Int32 // 0 before the outage, 1 during, 2 after, 3 finishing
	var afterOK [keys]atomic.Int32
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("key-%d", k)
			var pending []*message.Message
			seq := 0
			for ctx.Err() == nil {
				if phase.Load() < 3 {
					for range 1 + rand.IntN(20-min(len(pending), 19)) {
						m := message.NewMessage(watermill.NewUUID(), []byte(key+"-"+strconv.Itoa(seq)))
						m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
						m.Metadata.Set("seq", strconv.Itoa(seq))
						pending = append(pending, m)
						seq++
					}
				} else if len(pending) == 0 {
					return
				}
				err := pub.Publish(topic, pending...)
				n := forwarder.DeliveredPrefix(err, len(pending))
				mu.Lock()
				stats.calls++
				stats.delivered += n
				switch {
				case err == nil:
					stats.ok++
				case n > 0:
					stats.partial++
				default:
					stats.failed++
				}
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err != nil && !errors.Is(err, forwarder.ErrDestinationUnavailable) {
					wrongErrs = append(wrongErrs, err.Error())
				}
				for _, m := range pending[:n] {
					acked = append(acked, m.UUID)
				}
				mu.Unlock()
				pending = pending[n:]
				if err == nil && phase.Load() == 2 {
					afterOK[k].Add(1)
				}
				pause := 5 * time.Millisecond
				if err != nil {
					pause = 100 * time.Millisecond
				}
				select {
				case <-ctx.Done():
				case <-time.After(pause):
				}
			}
		}()
	}
	waitUntil(t, ctx, "calls before the outage", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stats.ok >= 20*keys
	})
	phase.Store(1)
	broker.stop(t)
	sleepCtx(ctx, plan.outage)
	broker.restart(t)
	phase.Store(2)
	waitUntil(t, ctx, "10 successful calls of every key after the restart", func() bool {
		for i := range afterOK {
			if afterOK[i].Load() < 10 {
				return false
			}
		}
		return true
	})
	phase.Store(3)
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("keys did not deliver their backlog: %v", ctx.Err())
	}

	t.Logf("%d calls: %d ok, %d partly delivered, %d failed; %d messages acknowledged, %d deliveries (%d duplicates)",
		stats.calls, stats.ok, stats.partial, stats.failed, stats.delivered, col.Len(), col.Duplicates())
	t.Logf("first failure: %v", firstErr)
	if len(wrongErrs) > 0 {
		t.Fatalf("%d failures do not say the broker was unavailable, first: %s", len(wrongErrs), wrongErrs[0])
	}
	if err := col.WaitUUIDs(ctx, acked, plan.wait); err != nil {
		t.Fatalf("acknowledged messages missing: %v", err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	return stats
}

// TestOutageForwarderKafka stops the Kafka broker in the middle of a keyed
// stream written into the outbox and restarts it on the same port, with
// kafkabatch and with watermill-kafka's publisher: every message arrives,
// per-key order holds, the forwarder resumes by itself, and it reads the
// outbox only a few times while the broker is down.
func TestOutageForwarderKafka(t *testing.T) {
	outageForwarderKafka(t, nil)
}

// TestOutageForwarderKafkaCDC is TestOutageForwarderKafka with the
// change-data-capture source.
func TestOutageForwarderKafkaCDC(t *testing.T) {
	outageForwarderKafka(t, cdcSource(testenv.Postgres(t)))
}

func outageForwarderKafka(t *testing.T, source func(testing.TB, sqladapters.Dialect) forwarder.Source) {
	for _, tc := range []struct {
		name string
		pub  func(t *testing.T, k *testenv.Kafka) message.Publisher
	}{
		{"kafkabatch", batchPublisher},
		{"watermill-kafka", func(t *testing.T, k *testenv.Kafka) message.Publisher { return k.KeyedPublisher(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.StartKafka(t, "outage")
			col := k.Collect(t, "outage")
			forwardThroughOutage(t, planOutage(), tc.pub(t, k), "outage", col.Collection, kafkaControl(k), source)
		})
	}
}

// TestOutageForwarderRabbitMQ is TestOutageForwarderKafka for RabbitMQ,
// stopped and started with rabbitmqctl, with watermill-amqp v3 and
// amqpbatch. It runs only when MILLBOX_BROKER_RESTARTS=1.
func TestOutageForwarderRabbitMQ(t *testing.T) {
	testenv.RequireBrokerRestarts(t)
	for _, tc := range []struct {
		name string
		pub  func(t *testing.T) message.Publisher
	}{
		{"watermill-amqp-v3", func(t *testing.T) message.Publisher { return testenv.AMQPPublisher(t) }},
		{"amqpbatch", func(t *testing.T) message.Publisher {
			p, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: testenv.RequireAMQP(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			queue := testenv.AMQPQueue(t)
			col := testenv.CollectAMQPAcrossRestarts(t, queue)
			forwardThroughOutage(t, planOutage(), tc.pub(t), queue, col.Collection, rabbitControl(), nil)
		})
	}
}

// forwardThroughOutage runs a forwarder from a Postgres outbox to pub,
// with the source source returns (nil: Polling), while a producer commits
// plan.messages keyed messages at plan.rate, stops the broker once a
// quarter of them is written, restarts it after plan.outage, and checks
// what arrived in col, how often the forwarder read the outbox meanwhile,
// and that once the outage is known the destination gets one call at a
// time.
func forwardThroughOutage(t *testing.T, plan outagePlan, pub message.Publisher, topic string, col *testenv.Collection, broker brokerControl, source func(testing.TB, sqladapters.Dialect) forwarder.Source) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	reads := countPendingReads(db, d)
	calls := &callRecorder{Publisher: pub}
	cfg := forwarder.Config{
		DB:          reads,
		Dialect:     d,
		Destination: calls,
		Retry:       forwarder.ExponentialRetry{Min: 100 * time.Millisecond, Max: time.Second},
		MaxAttempts: -1,
	}
	if source != nil {
		cfg.Source = source(t, d)
	}
	conformance.StartForwarder(t, cfg)
	ctx := testenv.Ctx(t, plan.wait+2*plan.outage+time.Duration(plan.messages/plan.rate)*time.Second)
	stream := writeStream(ctx, db, d, topic, plan)

	waitUntil(t, ctx, "a quarter of the stream", func() bool { return stream.written.Load() >= int64(plan.messages/4) })
	// Reads are counted while the broker is down: from the moment the
	// stop has finished (stopping RabbitMQ's application takes seconds,
	// during which it still serves) to the moment its restart begins.
	broker.stop(t)
	before, start := reads.n.Load(), time.Now()
	sleepCtx(ctx, plan.outage)
	down, downFor := reads.n.Load()-before, time.Since(start)
	broker.restart(t)
	restarted := time.Now()
	// Once a call has failed for the outage, the forwarder probes with one
	// call at a time. (A client that waits for its broker instead of
	// failing, as kafkabatch does up to its DeliveryTimeout, makes no
	// such failure in a short outage: its calls hang, and the reads
	// counted above stay few.)
	// A probe that succeeds ends the pause: RabbitMQ may still serve for
	// a moment while stop_app shuts it down, and a forwarder that finds
	// it there resumes every key, as it should.
	if failedAt, ok := firstFailure(calls.spans(), start); ok {
		until := restarted
		if ok := firstSuccess(calls.spans(), failedAt); ok.Before(until) {
			until = ok
		}
		if _, n, _ := probeStats(calls.spans(), failedAt, until); n > 1 {
			t.Errorf("%d calls of the destination at once after one had failed for the outage and before one succeeded; want one probe at a time", n)
		}
	}

	<-stream.done
	if stream.err != nil {
		t.Fatalf("producer: %v", stream.err)
	}
	if err := col.WaitN(ctx, plan.messages, plan.wait); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if err := col.CheckOrder(stream.expected); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages, %d keys, %d/s, broker down %v: all delivered in order %v after the restart, %d duplicates; pending reads: %d while down, %d in all",
		plan.messages, plan.keys, plan.rate, downFor.Round(100*time.Millisecond), time.Since(restarted).Round(100*time.Millisecond),
		col.Duplicates(), down, reads.n.Load())
	if source == nil && reads.n.Load() == 0 {
		// The polling source reads all along; the change-data-capture
		// source reads the table only for keys that failed.
		t.Fatal("no pending read was counted: the forwarder reads with a statement the counter does not know")
	}
	if down > maxPendingReadsDown {
		t.Fatalf("the forwarder read the outbox %d times while the broker was down (%v); it should pause behind a probe (at most %d reads)",
			down, downFor.Round(100*time.Millisecond), maxPendingReadsDown)
	}
}

// firstFailure returns when the first call that started after from and
// failed ended.
func firstFailure(calls []callSpan, from time.Time) (time.Time, bool) {
	var first time.Time
	for _, c := range calls {
		if c.err != nil && !c.start.Before(from) && (first.IsZero() || c.end.Before(first)) {
			first = c.end
		}
	}
	return first, !first.IsZero()
}

// firstSuccess returns when the first call that started at or after from
// and succeeded ended, or the far future if none did.
func firstSuccess(calls []callSpan, from time.Time) time.Time {
	first := time.Unix(1<<40, 0)
	for _, c := range calls {
		if c.err == nil && !c.end.IsZero() && !c.start.Before(from) && c.end.Before(first) {
			first = c.end
		}
	}
	return first
}

// stream is a producer committing keyed messages at a steady rate.
type stream struct {
	written  atomic.Int64
	expected map[string][]string // key -> UUIDs in commit order; read after done
	done     chan struct{}
	err      error
}

// writeStream commits plan.messages messages to topic through the outbox,
// ten per transaction from one goroutine, at plan.rate: message i has key
// i mod plan.keys and metadata seq i div plan.keys.
func writeStream(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, plan outagePlan) *stream {
	const perTx = 10
	s := &stream{expected: map[string][]string{}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Second * perTx / time.Duration(plan.rate))
		defer tick.Stop()
		for i := 0; i < plan.messages; {
			select {
			case <-ctx.Done():
				s.err = ctx.Err()
				return
			case <-tick.C:
			}
			var msgs []*message.Message
			for ; len(msgs) < perTx && i < plan.messages; i++ {
				key := fmt.Sprintf("key-%d", i%plan.keys)
				m := message.NewMessage(watermill.NewUUID(), []byte(key))
				m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
				m.Metadata.Set("seq", strconv.Itoa(i/plan.keys))
				msgs = append(msgs, m)
			}
			if s.err = commitMessages(ctx, db, d, topic, msgs); s.err != nil {
				return
			}
			for _, m := range msgs {
				key := m.Metadata.Get(forwarder.DefaultKeyMetadataField)
				s.expected[key] = append(s.expected[key], m.UUID)
			}
			s.written.Add(int64(len(msgs)))
		}
	}()
	return s
}

func commitMessages(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, msgs []*message.Message) error {
	tx, err := db.Begin(ctx, sqlTxOptions)
	if err != nil {
		return err
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err == nil {
		err = pub.Publish(topic, msgs...)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// pendingReads is a sqladapters.DB that counts the statements that read
// pending outbox rows (the dialect's ReadPending), on the DB and in its
// transactions.
type pendingReads struct {
	sqladapters.DB
	prefixes []string
	n        atomic.Int64
}

// countPendingReads wraps db. A pending read's text varies with the
// partitions read and the limit; what every variant of the statement starts
// with is found by recording two that differ in both.
func countPendingReads(db sqladapters.DB, d sqladapters.Dialect) *pendingReads {
	sel := func(q sqladapters.PendingQuery) string {
		var rec statementRecorder
		_, _ = d.ReadPending(context.Background(), &rec, q, false)
		return rec.sql
	}
	a := sel(sqladapters.PendingQuery{Partitions: 16, Limit: 1})
	b := sel(sqladapters.PendingQuery{Partitions: 16, Owned: []int{3}, Limit: 2})
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return &pendingReads{DB: db, prefixes: []string{a[:n]}}
}

// statementRecorder is an executor that records the first statement it is
// given and fails it, to learn which statement a dialect runs.
type statementRecorder struct{ sql string }

var errRecorded = errors.New("recorded, not run")

func (r *statementRecorder) Exec(_ context.Context, query string, _ ...any) (int64, error) {
	if r.sql == "" {
		r.sql = query
	}
	return 0, errRecorded
}

func (r *statementRecorder) Query(_ context.Context, query string, _ ...any) (sqladapters.Rows, error) {
	if r.sql == "" {
		r.sql = query
	}
	return nil, errRecorded
}

func (p *pendingReads) count(query string) {
	for _, prefix := range p.prefixes {
		if strings.HasPrefix(query, prefix) {
			p.n.Add(1)
			return
		}
	}
}

// Query counts and runs a statement.
func (p *pendingReads) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	p.count(query)
	return p.DB.Query(ctx, query, args...)
}

// Begin begins a transaction whose statements are counted too.
func (p *pendingReads) Begin(ctx context.Context, opts sql.TxOptions) (sqladapters.Tx, error) {
	tx, err := p.DB.Begin(ctx, opts)
	if err != nil {
		return nil, err
	}
	return pendingReadsTx{Tx: tx, p: p}, nil
}

// Listen keeps the wrapped DB's notifications, so the forwarder wakes up
// as it would without the wrapper.
func (p *pendingReads) Listen(ctx context.Context, channel string, ready, notify func()) error {
	l, ok := p.DB.(sqladapters.Listener)
	if !ok {
		return errors.New("the wrapped DB cannot listen")
	}
	return l.Listen(ctx, channel, ready, notify)
}

type pendingReadsTx struct {
	sqladapters.Tx
	p *pendingReads
}

func (tx pendingReadsTx) Query(ctx context.Context, query string, args ...any) (sqladapters.Rows, error) {
	tx.p.count(query)
	return tx.Tx.Query(ctx, query, args...)
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// seqMessages returns n messages of key with seq from..from+n-1.
func seqMessages(key string, from, n int) []*message.Message {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(key))
		msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, key)
		msgs[i].Metadata.Set("seq", strconv.Itoa(from+i))
	}
	return msgs
}

// TestKafkaBatchStopsAtFailedMessage: a message Kafka cannot take in the
// middle of a call ends the call there. The messages before it are
// delivered and reported as the PartialError's prefix, the one after it
// is not written, and the failure is the message's, not the broker's.
func TestKafkaBatchStopsAtFailedMessage(t *testing.T) {
	k := testenv.StartKafka(t, "partial")
	col := k.Collect(t, "partial")
	pub := batchPublisher(t, k)
	msgs := seqMessages("key-1", 0, 4)
	msgs[2].Payload = make([]byte, 2<<20) // over a record batch's 1 MB
	err := pub.Publish("partial", msgs...)
	var pe *forwarder.PartialError
	if !errors.As(err, &pe) || pe.Delivered != 2 {
		t.Fatalf("want a PartialError with 2 delivered, got %v", err)
	}
	if errors.Is(err, forwarder.ErrDestinationUnavailable) || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("the failure must be the message's and say so: %v", err)
	}
	// The key goes on from the failed message, as the forwarder would
	// after dead-lettering it.
	next := seqMessages("key-1", 4, 1)
	if err := pub.Publish("partial", next...); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Ctx(t, time.Minute)
	if err := col.WaitUUIDs(ctx, []string{msgs[0].UUID, msgs[1].UUID, next[0].UUID}, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, ok := col.Get(msgs[3].UUID); ok {
		t.Fatal("the message after the failed one was written")
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
}

// TestAMQPBatchNack: a queue that is full and rejects publishes
// (x-max-length with x-overflow reject-publish-dlx) nacks the messages
// beyond its length. The confirmed prefix is reported, and the error says
// the broker rejected the message, not that it was unavailable. Without
// ConfirmEach the call's later messages were published (and rejected) too;
// with it, none after the first rejected one was published.
func TestAMQPBatchNack(t *testing.T) {
	url := testenv.RequireAMQP(t)
	for _, confirmEach := range []bool{false, true} {
		t.Run(fmt.Sprintf("ConfirmEach=%v", confirmEach), func(t *testing.T) {
			queue := testenv.UniqueName("millbox_test_full_")
			rejected := testenv.DeclareBoundedQueue(t, url, queue, amqp.Table{"x-max-length": int32(3)})
			pub, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: url, ConfirmEach: confirmEach})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			err = pub.Publish(queue, seqMessages("key-1", 0, 6)...)
			var pe *forwarder.PartialError
			if !errors.As(err, &pe) || pe.Delivered != 3 {
				t.Fatalf("want a PartialError with 3 delivered, got %v", err)
			}
			if errors.Is(err, forwarder.ErrDestinationUnavailable) || !strings.Contains(err.Error(), "rejected it (nack)") {
				t.Fatalf("the failure must be a rejection and say so: %v", err)
			}
			if n, err := testenv.AMQPQueueLength(url, queue); err != nil || n != 3 {
				t.Fatalf("queue holds %d messages (%v), want the 3 confirmed", n, err)
			}
			want := 3 // messages 3, 4 and 5
			if confirmEach {
				want = 1 // message 3 only
			}
			// Dead-lettering happens after the nack: wait for it.
			conformance.WaitFor(t, "rejected messages dead-lettered", func() bool {
				n, err := testenv.AMQPQueueLength(url, rejected)
				return err == nil && n >= want
			})
			if n, _ := testenv.AMQPQueueLength(url, rejected); n != want {
				t.Fatalf("%d messages were published and rejected, want %d", n, want)
			}
		})
	}
}

// TestAMQPBatchNackThenAck: a queue limited in bytes rejects a large
// message and accepts the small one published after it in the same call.
// Without ConfirmEach the error says so, since the queue now holds the
// later message ahead of the rejected one; with ConfirmEach the later
// message is not published.
func TestAMQPBatchNackThenAck(t *testing.T) {
	url := testenv.RequireAMQP(t)
	for _, confirmEach := range []bool{false, true} {
		t.Run(fmt.Sprintf("ConfirmEach=%v", confirmEach), func(t *testing.T) {
			queue := testenv.UniqueName("millbox_test_bytes_")
			testenv.DeclareBoundedQueue(t, url, queue, amqp.Table{"x-max-length-bytes": int32(1000)})
			pub, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: url, ConfirmEach: confirmEach})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			msgs := seqMessages("key-1", 0, 3)
			msgs[1].Payload = make([]byte, 2000) // over the queue's 1000 bytes
			err = pub.Publish(queue, msgs...)
			var pe *forwarder.PartialError
			if !errors.As(err, &pe) || pe.Delivered != 1 || !strings.Contains(err.Error(), "rejected it (nack)") {
				t.Fatalf("want a rejection after 1 delivered, got %v", err)
			}
			want, said := 2, strings.Contains(err.Error(), "1 later messages of the call were accepted after it")
			if confirmEach {
				want = 1
			}
			if said != !confirmEach {
				t.Fatalf("error about the later message accepted after the rejected one: %v", err)
			}
			if n, err := testenv.AMQPQueueLength(url, queue); err != nil || n != want {
				t.Fatalf("queue holds %d messages (%v), want %d", n, err, want)
			}
		})
	}
}
