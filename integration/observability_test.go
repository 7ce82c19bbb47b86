package integration_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
)

// countingExecutor counts the statements run through it.
type countingExecutor struct {
	sqladapters.Executor
	queries atomic.Int64
}

func (c *countingExecutor) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	c.queries.Add(1)
	return c.Executor.Query(ctx, q, args...)
}

// outboxGauges is one collection of the outbox gauges.
type outboxGauges struct {
	pending, dead, held int64
	scheduled           int64
	age                 float64
	table               string
	found               bool
}

func collectOutboxGauges(t *testing.T, r *sdkmetric.ManualReader) outboxGauges {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var g outboxGauges
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					v, _ := dp.Attributes.Value(forwarder.AttrOutboxTable)
					g.table, g.found = v.AsString(), true
					switch m.Name {
					case forwarder.MetricOutboxPending:
						g.pending = dp.Value
					case forwarder.MetricOutboxDeadLetters:
						g.dead = dp.Value
					case forwarder.MetricOutboxHeldKeys:
						g.held = dp.Value
					case forwarder.MetricOutboxScheduled:
						g.scheduled = dp.Value
					}
				}
			case metricdata.Gauge[float64]:
				if m.Name == forwarder.MetricOutboxOldestPendingAge {
					for _, dp := range data.DataPoints {
						g.age = dp.Value
					}
				}
			}
		}
	}
	return g
}

func newManualMeter(t *testing.T) (*sdkmetric.ManualReader, *sdkmetric.MeterProvider) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return r, mp
}

// publishRows writes n messages to topic in one committed transaction.
func publishRows(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	}
	publishMessages(t, ctx, db, d, topic, msgs...)
}

// publishMessages writes msgs to topic in one committed transaction.
func publishMessages(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, msgs ...*message.Message) {
	t.Helper()
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// outboxMetricsSuite checks the outbox gauges on one database: they follow
// publishes, dead letters and completions, the age grows while nothing
// forwards, and a cached registration reads the outbox once.
func outboxMetricsSuite(t *testing.T, env conformance.Env) {
	ctx := testenv.Ctx(t, time.Minute)
	d := env.NewDialect(t)
	reader, mp := newManualMeter(t)
	db := &countingExecutor{Executor: env.DB}
	unregister, err := forwarder.RegisterOutboxMetrics(mp, db, d, forwarder.OutboxMetricsOptions{MinInterval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}

	g := collectOutboxGauges(t, reader)
	if !g.found || g.pending != 0 || g.dead != 0 || g.age != 0 {
		t.Fatalf("empty outbox: %+v", g)
	}
	if want := strings.NewReplacer(`"`, "", "`", "").Replace(d.OutboxTable()); g.table != want || g.table == "" {
		t.Errorf("table attribute %q", g.table)
	}

	const n = 5
	publishRows(t, ctx, env.DB, d, "orders", n)
	g1 := collectOutboxGauges(t, reader)
	if g1.pending != n || g1.dead != 0 || g1.age < 0 {
		t.Fatalf("after %d publishes: %+v", n, g1)
	}
	time.Sleep(50 * time.Millisecond)
	g2 := collectOutboxGauges(t, reader)
	if g2.pending != n || g2.age <= g1.age {
		t.Fatalf("the oldest age did not grow while nothing forwards: %+v then %+v", g1, g2)
	}

	rows := conformance.ReadPending(t, ctx, env.DB, d)
	if len(rows) != n {
		t.Fatalf("%d pending rows, want %d", len(rows), n)
	}
	if _, err := d.RecordFailure(ctx, env.DB, sqladapters.Failure{ID: rows[0].ID, Attempts: 3, Error: "broker down", Dead: true}); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.pending != n-1 || g.dead != 1 {
		t.Fatalf("after a dead letter: %+v", g)
	}
	ids := make([]int64, 0, n-1)
	for _, r := range rows[1:] {
		ids = append(ids, r.ID)
	}
	if _, err := d.CompleteForwarded(ctx, env.DB, ids, false); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.pending != 0 || g.dead != 1 || g.age != 0 {
		t.Fatalf("after draining: %+v", g)
	}
	stats, err := d.OutboxStats(ctx, env.DB)
	if err != nil {
		t.Fatal(err)
	}
	if stats != (sqladapters.OutboxStats{Dead: 1}) {
		t.Fatalf("stats %+v disagree with the gauges, 1 dead and nothing pending", stats)
	}
	later := sqladapters.OutboxMessage{Topic: "orders", UUID: "later", Payload: []byte{}, Metadata: []byte(`{}`), DueAt: time.Now().Add(time.Hour)}
	if err := d.InsertOutbox(ctx, env.DB, []sqladapters.OutboxMessage{later}); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.pending != 0 || g.scheduled != 1 {
		t.Fatalf("after a delayed message: %+v", g)
	}

	// A dead letter that holds its key counts one held key; one without
	// a key holds nothing.
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7")
	publishMessages(t, ctx, env.DB, d, "orders", msg)
	publishRows(t, ctx, env.DB, d, "orders", 1)
	for _, r := range conformance.ReadPending(t, ctx, env.DB, d) {
		if _, err := d.RecordFailure(ctx, env.DB, sqladapters.Failure{ID: r.ID, Attempts: 3, Error: "rejected", Dead: true, Hold: true}); err != nil {
			t.Fatal(err)
		}
	}
	if g = collectOutboxGauges(t, reader); g.pending != 0 || g.dead != 3 || g.held != 1 {
		t.Fatalf("after a dead letter holding its key: %+v", g)
	}

	if err := unregister(); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.found {
		t.Fatalf("unregistered gauges still reported: %+v", g)
	}

	// A registration with a long interval reads the outbox once, however
	// often it is collected.
	cached := &countingExecutor{Executor: env.DB}
	unregister, err = forwarder.RegisterOutboxMetrics(mp, cached, d, forwarder.OutboxMetricsOptions{MinInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unregister() }()
	first := collectOutboxGauges(t, reader)
	publishRows(t, ctx, env.DB, d, "orders", 2)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var rm metricdata.ResourceMetrics
			_ = reader.Collect(context.Background(), &rm)
		})
	}
	wg.Wait()
	if again := collectOutboxGauges(t, reader); again != first {
		t.Errorf("cached collection %+v differs from the first %+v", again, first)
	}
	if q := cached.queries.Load(); q != 1 {
		t.Errorf("%d queries for 10 collections within the interval, want 1", q)
	}
}

func TestOutboxMetricsPostgres(t *testing.T) {
	outboxMetricsSuite(t, pgDialectEnv(testenv.Postgres(t)))
}

func TestOutboxMetricsSQLite(t *testing.T) {
	outboxMetricsSuite(t, sqliteEnv(t))
}

func TestOutboxMetricsMySQL(t *testing.T) {
	outboxMetricsSuite(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
}

// consumed returns the inbox counter by duplicate flag and error type.
func consumed(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != middleware.MetricConsumedMessages {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				dup, _ := dp.Attributes.Value(middleware.AttrInboxDuplicate)
				et, _ := dp.Attributes.Value("error.type")
				topic, _ := dp.Attributes.Value("messaging.destination.name")
				out[fmt.Sprintf("%s duplicate=%v error=%s", topic.AsString(), dup.AsBool(), et.AsString())] = dp.Value
			}
		}
	}
	return out
}

// TestTraceContinuesFromOutboxToInboxHandler publishes into the outbox
// inside a traced request, delivers the stored row through a router to a
// handler under the inbox middleware, and checks that the handler runs in
// the request's trace; a redelivery is a duplicate and a failing handler
// is counted as such.
func TestTraceContinuesFromOutboxToInboxHandler(t *testing.T) {
	pool := testenv.Postgres(t)
	env := pgDialectEnv(pool)
	d := env.NewDialect(t)
	ctx := testenv.Ctx(t, time.Minute)

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reader, mp := newManualMeter(t)

	// The producing request.
	reqCtx, reqSpan := tp.Tracer("shop").Start(ctx, "POST /checkout")
	producer := reqSpan.SpanContext()
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := env.DB.Begin(reqCtx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := message.NewMessage(watermill.NewUUID(), []byte(`{"order":1}`))
	bad := message.NewMessage(watermill.NewUUID(), []byte(`{"order":2}`))
	for _, m := range []*message.Message{good, bad} {
		m.SetContext(sqladapters.WithTx(reqCtx, tx))
	}
	if err := pub.Publish("orders", good, bad); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	reqSpan.End()

	// What a forwarder reads and a broker delivers: the stored row.
	rows := conformance.ReadPending(t, ctx, env.DB, d)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2", len(rows))
	}
	if tp := rows[0].Metadata["traceparent"]; !strings.Contains(tp, producer.TraceID().String()) {
		t.Fatalf("stored traceparent %q is not in trace %s", tp, producer.TraceID())
	}

	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{
		DB: env.DB, Dialect: d, Consumer: "billing",
		Telemetry: middleware.Telemetry{MeterProvider: mp, TracerProvider: tp, MessagingSystem: "kafka"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	handlerTraces := map[string]trace.SpanContext{}
	var runs atomic.Int64
	gc := conformance.NewGoChannel(t, false)
	conformance.StartRouter(t, func(r *message.Router) {
		r.AddConsumerHandler("invoices", "orders", gc, func(msg *message.Message) error {
			if _, err := sqladapters.TxFromContext(msg.Context()); err != nil {
				return err
			}
			mu.Lock()
			handlerTraces[msg.UUID] = trace.SpanContextFromContext(msg.Context())
			mu.Unlock()
			defer runs.Add(1)
			if msg.UUID == bad.UUID {
				return errors.New("invoice service refused")
			}
			return nil
		})
		// Outermost, as a poison queue would be: a failed message is
		// acked after the inbox counted it, instead of redelivered for ever.
		r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				if err != nil {
					return nil, nil
				}
				return out, nil
			}
		}, inboxMW)
	})
	deliver := func(row conformance.Row) {
		msg := message.NewMessage(row.UUID, row.Payload)
		for k, v := range row.Metadata {
			msg.Metadata.Set(k, v)
		}
		if err := gc.Publish("orders", msg); err != nil {
			t.Fatal(err)
		}
	}
	goodRow, badRow := rows[0], rows[1]
	if goodRow.UUID != good.UUID {
		goodRow, badRow = badRow, goodRow
	}
	deliver(goodRow)
	deliver(goodRow) // a redelivery
	conformance.WaitFor(t, "two deliveries", func() bool { return len(processSpans(spans)) == 2 })
	deliver(badRow)
	conformance.WaitFor(t, "the failing handler's span", func() bool { return len(processSpans(spans)) == 3 })

	mu.Lock()
	sc := handlerTraces[good.UUID]
	mu.Unlock()
	if sc.TraceID() != producer.TraceID() {
		t.Fatalf("handler ran in trace %s, want the request's %s", sc.TraceID(), producer.TraceID())
	}
	var dups, firsts, failed int
	for _, s := range processSpans(spans) {
		if s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("process span %s is in trace %s, want %s", s.Name(), s.SpanContext().TraceID(), producer.TraceID())
		}
		if s.Parent().SpanID() != producer.SpanID() || s.SpanKind() != trace.SpanKindConsumer || s.Name() != "process orders" {
			t.Errorf("process span %q kind %s parent %s, want consumer child of %s", s.Name(), s.SpanKind(), s.Parent().SpanID(), producer.SpanID())
		}
		attrs := attribute.NewSet(s.Attributes()...)
		dup, _ := attrs.Value(middleware.AttrInboxDuplicate)
		switch {
		case s.Status().Code == codes.Error:
			et, _ := attrs.Value("error.type")
			if et.AsString() != middleware.ErrorClassHandler {
				t.Errorf("failed span error.type %q", et.AsString())
			}
			failed++
		case dup.AsBool():
			dups++
		default:
			firsts++
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), good.UUID) || strings.Contains(kv.Value.Emit(), bad.UUID) {
				t.Errorf("span attribute %s names a message", kv.Key)
			}
		}
	}
	if firsts != 1 || dups != 1 || failed != 1 || runs.Load() != 2 {
		t.Errorf("process spans: %d first, %d duplicate, %d failed", firsts, dups, failed)
	}

	got := consumed(t, reader)
	if got["orders duplicate=false error="] != 1 || got["orders duplicate=true error="] != 1 || got["orders duplicate=false error=handler"] != 1 {
		t.Errorf("consumed messages: %v", got)
	}
}

// processSpans returns the ended inbox spans.
func processSpans(r *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.Ended() {
		if strings.HasPrefix(s.Name(), "process") {
			out = append(out, s)
		}
	}
	return out
}

// TestTraceContinuesThroughBrokers writes a message into the outbox inside
// a traced request, forwards it to Kafka (kfake) or RabbitMQ, and consumes
// it through the inbox middleware: the forwarder's send span, the
// consumer's process span and the handler are in the request's trace,
// carried by the metadata the brokers turn into headers.
func TestTraceContinuesThroughBrokers(t *testing.T) {
	for _, c := range []struct {
		name   string
		broker func(*testing.T) inboxBroker
	}{
		{"kafka", inboxKafka},
		{"rabbitmq", inboxRabbit},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := c.broker(t)
			pool := testenv.Postgres(t)
			env := pgDialectEnv(pool)
			d := env.NewDialect(t)
			ctx := testenv.Ctx(t, time.Minute)
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

			inboxMW, err := middleware.NewInbox(middleware.InboxConfig{
				DB: env.DB, Dialect: d, Consumer: "billing",
				Telemetry: middleware.Telemetry{TracerProvider: tp, MessagingSystem: c.name},
			})
			if err != nil {
				t.Fatal(err)
			}
			handled := make(chan trace.SpanContext, 1)
			conformance.StartRouter(t, func(r *message.Router) {
				r.AddConsumerHandler("invoices", b.topic, b.newSub(t), func(msg *message.Message) error {
					select {
					case handled <- trace.SpanContextFromContext(msg.Context()):
					default:
					}
					return nil
				})
				r.AddMiddleware(inboxMW)
			})
			conformance.StartForwarder(t, forwarder.Config{
				DB:          env.DB,
				Dialect:     d,
				Destination: b.pub,
				Telemetry:   forwarder.Telemetry{TracerProvider: tp, MessagingSystem: c.name},
			})

			reqCtx, reqSpan := tp.Tracer("shop").Start(ctx, "POST /checkout")
			tx, err := env.DB.Begin(reqCtx, sql.TxOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d})
			if err != nil {
				t.Fatal(err)
			}
			msg := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			msg.SetContext(sqladapters.WithTx(reqCtx, tx))
			if err := pub.Publish(b.topic, msg); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			reqSpan.End()

			select {
			case sc := <-handled:
				if sc.TraceID() != reqSpan.SpanContext().TraceID() {
					t.Fatalf("handler ran in trace %s, want the request's %s", sc.TraceID(), reqSpan.SpanContext().TraceID())
				}
			case <-time.After(conformance.WaitTimeout):
				t.Fatal("the message was not handled")
			}

			// The forwarder's send span and the consumer's process span
			// are in the request's trace, children of the producing span.
			producer := reqSpan.SpanContext()
			var send, process sdktrace.ReadOnlySpan
			conformance.WaitFor(t, "the send and process spans", func() bool {
				for _, s := range spans.Ended() {
					switch s.Name() {
					case "send " + b.topic:
						send = s
					case "process " + b.topic:
						process = s
					}
				}
				return send != nil && process != nil
			})
			sendAttrs := attribute.NewSet(send.Attributes()...)
			op, _ := sendAttrs.Value("messaging.operation.name")
			dest, _ := sendAttrs.Value("messaging.destination.name")
			sys, _ := sendAttrs.Value("messaging.system")
			if op.AsString() != "send" || dest.AsString() != b.topic || sys.AsString() != c.name || send.SpanKind() != trace.SpanKindProducer {
				t.Errorf("send span kind %s attributes %v", send.SpanKind(), send.Attributes())
			}
			if send.Status().Code == codes.Error {
				t.Errorf("send span failed: %s", send.Status().Description)
			}
			for _, s := range []sdktrace.ReadOnlySpan{send, process} {
				if s.SpanContext().TraceID() != producer.TraceID() || s.Parent().SpanID() != producer.SpanID() {
					t.Errorf("span %q in trace %s with parent %s, want trace %s and parent %s",
						s.Name(), s.SpanContext().TraceID(), s.Parent().SpanID(), producer.TraceID(), producer.SpanID())
				}
			}
		})
	}
}

// collect reads every metric of r.
func collect(t *testing.T, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// points calls each for every data point of the metric name, with its
// attributes and its value: the sum of a counter, the value of a gauge,
// the count of a histogram.
func points(rm metricdata.ResourceMetrics, name string, each func(attrs attribute.Set, v int64)) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					each(dp.Attributes, dp.Value)
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					each(dp.Attributes, dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					each(dp.Attributes, int64(dp.Count))
				}
			case metricdata.Histogram[int64]:
				for _, dp := range data.DataPoints {
					each(dp.Attributes, int64(dp.Count))
				}
			}
		}
	}
}

// byOutcome sums the metric name by destination topic and error.type,
// as "topic error=class" ("topic error=" for successes).
func byOutcome(rm metricdata.ResourceMetrics, name string) map[string]int64 {
	out := map[string]int64{}
	points(rm, name, func(attrs attribute.Set, v int64) {
		topic, _ := attrs.Value("messaging.destination.name")
		et, _ := attrs.Value("error.type")
		out[topic.AsString()+" error="+et.AsString()] += v
	})
	return out
}

// checkBoundedAttributes fails if a data point of any metric carries a
// message id or an ordering key.
func checkBoundedAttributes(t *testing.T, rm metricdata.ResourceMetrics, forbidden ...string) {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			points(rm, m.Name, func(attrs attribute.Set, _ int64) {
				for _, kv := range attrs.ToSlice() {
					for _, f := range forbidden {
						if strings.Contains(kv.Value.Emit(), f) {
							t.Errorf("%s attribute %s=%q names a message or key", m.Name, kv.Key, kv.Value.Emit())
						}
					}
				}
			})
		}
	}
}

// publishKeyed writes one committed message per key to topic and returns
// the messages.
func publishKeyed(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, keys ...string) []*message.Message {
	t.Helper()
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*message.Message, len(keys))
	for i, k := range keys {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
		msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, k)
	}
	if err := pub.Publish(topic, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// errTooLarge is a destination's refusal of one message: a failure about
// the message, retried with backoff and dead-lettered, unlike a lost
// connection, which pauses the forwarder.
var errTooLarge = errors.New("message too large")

// TestForwarderMetricsPostgres drains an outbox through a forwarder with
// an SDK meter and reads its metrics: every send counted once by topic,
// the outbox gauges back to zero, one commit-to-ack measurement per
// message; and a destination that refuses messages shows as failed sends
// and dead letters of their topic.
func TestForwarderMetricsPostgres(t *testing.T) {
	pool := testenv.Postgres(t)
	forwarderMetricsSuite(t, pgDialectEnv(pool), func(testing.TB, sqladapters.Dialect) forwarder.Source {
		return forwarder.Polling{Partitions: 4}
	}, 4)
}

// TestForwarderMetricsCDC is TestForwarderMetricsPostgres with the
// change-data-capture source: the same instruments, the same counts (the
// active reader holds the slot as one partition).
func TestForwarderMetricsCDC(t *testing.T) {
	pool := testenv.Postgres(t)
	forwarderMetricsSuite(t, pgDialectEnv(pool), cdcSource(pool), 1)
}

// forwarderMetricsSuite checks the forwarder's instruments with the
// source source returns; the running instance holds partitions of them.
func forwarderMetricsSuite(t *testing.T, env conformance.Env, source func(testing.TB, sqladapters.Dialect) forwarder.Source, partitions int64) {

	t.Run("drain", func(t *testing.T) {
		ctx := testenv.Ctx(t, time.Minute)
		d := env.NewDialect(t)
		reader, mp := newManualMeter(t)
		unregister, err := forwarder.RegisterOutboxMetrics(mp, env.DB, d, forwarder.OutboxMetricsOptions{MinInterval: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unregister() })

		const n = 40
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("customer-%d", i%7)
		}
		msgs := publishKeyed(t, ctx, env.DB, d, "orders", keys...)
		if g := collectOutboxGauges(t, reader); g.pending != n {
			t.Fatalf("before forwarding: %+v, want %d pending", g, n)
		}

		dest := conformance.NewRecorder()
		conformance.StartForwarder(t, forwarder.Config{
			DB:          env.DB,
			Dialect:     d,
			Destination: dest,
			Telemetry:   forwarder.Telemetry{MeterProvider: mp, MessagingSystem: "kafka"},
			Source:      source(t, d),
		})
		dest.WaitFor(t, n, conformance.WaitTimeout)
		conformance.WaitFor(t, "the outbox pending gauge to reach 0", func() bool {
			return collectOutboxGauges(t, reader).pending == 0
		})

		rm := collect(t, reader)
		if got := byOutcome(rm, forwarder.MetricSentMessages); len(got) != 1 || got["orders error="] != n {
			t.Errorf("sent messages %v, want %d to orders and no failure", got, n)
		}
		if got := byOutcome(rm, forwarder.MetricCommitToAck); len(got) != 1 || got["orders error="] != n {
			t.Errorf("commit-to-ack measurements %v, want %d for orders", got, n)
		}
		if got := byOutcome(rm, forwarder.MetricOperationDuration); got["orders error="] < 1 || len(got) != 1 {
			t.Errorf("publish call durations %v, want successful calls to orders only", got)
		}
		var batchRows, running, held int64
		points(rm, forwarder.MetricBatchSize, func(_ attribute.Set, v int64) { batchRows += v })
		points(rm, forwarder.MetricRunning, func(_ attribute.Set, v int64) { running += v })
		points(rm, forwarder.MetricPartitions, func(_ attribute.Set, v int64) { held += v })
		if batchRows < 1 || running != 1 || held != partitions {
			t.Errorf("batches %d, running %d, partitions %d; want some, 1 and %d", batchRows, running, held, partitions)
		}
		table := strings.NewReplacer(`"`, "", "`", "").Replace(d.OutboxTable())
		points(rm, forwarder.MetricSentMessages, func(attrs attribute.Set, _ int64) {
			tab, _ := attrs.Value(forwarder.AttrOutboxTable)
			sys, _ := attrs.Value("messaging.system")
			op, _ := attrs.Value("messaging.operation.name")
			if tab.AsString() != table || sys.AsString() != "kafka" || op.AsString() != "send" {
				t.Errorf("sent messages attributes %v", attrs.ToSlice())
			}
		})
		forbidden := []string{"customer-"}
		for _, m := range msgs {
			forbidden = append(forbidden, m.UUID)
		}
		checkBoundedAttributes(t, rm, forbidden...)
	})

	t.Run("failures", func(t *testing.T) {
		ctx := testenv.Ctx(t, time.Minute)
		d := env.NewDialect(t)
		reader, mp := newManualMeter(t)
		dest := conformance.NewRecorder()
		dest.SetReject(func(_ string, m *message.Message) error {
			if m.Metadata.Get("size") == "huge" {
				return errTooLarge
			}
			return nil
		})
		const maxAttempts = 3
		conformance.StartForwarder(t, forwarder.Config{
			DB:                  env.DB,
			Dialect:             d,
			Destination:         dest,
			MaxAttempts:         maxAttempts,
			Retry:               forwarder.ExponentialRetry{Min: time.Millisecond, Max: 5 * time.Millisecond},
			DelayedPollInterval: 20 * time.Millisecond,
			Telemetry:           forwarder.Telemetry{MeterProvider: mp},
			Source:              conformance.PollEvery(source(t, d), 20*time.Millisecond),
		})

		// Two refused messages of two keys (too few to look like an
		// outage) and two accepted ones.
		tx, err := env.DB.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		var msgs []*message.Message
		for i, topic := range []string{"invoices", "invoices", "orders", "orders"} {
			m := message.NewMessage(watermill.NewUUID(), []byte(`{}`))
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprintf("customer-%d", i))
			if topic == "invoices" {
				m.Metadata.Set("size", "huge")
			}
			if err := pub.Publish(topic, m); err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}

		dest.WaitFor(t, 2, conformance.WaitTimeout)
		conformance.WaitFor(t, "two dead letters", func() bool {
			dead, err := listDeadLetters(ctx, env.DB, d)
			if err != nil {
				t.Fatal(err)
			}
			return len(dead) == 2
		})
		// The counters are recorded before the dead letter is written.
		rm := collect(t, reader)
		want := map[string]int64{"orders error=": 2, "invoices error=" + forwarder.ErrorClassPublish: 2 * maxAttempts}
		if got := byOutcome(rm, forwarder.MetricSentMessages); !maps.Equal(got, want) {
			t.Errorf("sent messages %v, want %v", got, want)
		}
		if got := byOutcome(rm, forwarder.MetricOperationDuration); got["invoices error="+forwarder.ErrorClassPublish] != 2*maxAttempts {
			t.Errorf("publish call durations %v, want %d failed calls to invoices", got, 2*maxAttempts)
		}
		if got := byOutcome(rm, forwarder.MetricDeadLettered); !maps.Equal(got, map[string]int64{"invoices error=": 2}) {
			t.Errorf("dead lettered %v, want 2 of invoices", got)
		}
		if got := byOutcome(rm, forwarder.MetricCommitToAck); !maps.Equal(got, map[string]int64{"orders error=": 2}) {
			t.Errorf("commit-to-ack measurements %v, want 2 for orders", got)
		}
		forbidden := []string{"customer-", errTooLarge.Error()}
		for _, m := range msgs {
			forbidden = append(forbidden, m.UUID)
		}
		checkBoundedAttributes(t, rm, forbidden...)
	})
}

// readiness is one answer of the readiness check.
type readiness struct {
	code   int
	Status string   `json:"status"`
	Reason []string `json:"reasons"`
	Detail struct {
		Running    bool  `json:"running"`
		Partitions []int `json:"partitions"`
		Pending    int64 `json:"pending"`
	} `json:"forwarder"`
}

func (r readiness) String() string {
	return fmt.Sprintf("%d %s %q running=%v partitions=%v pending=%d", r.code, r.Status, r.Reason, r.Detail.Running, r.Detail.Partitions, r.Detail.Pending)
}

func checkReady(t *testing.T, h http.Handler) readiness {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	r := readiness{code: w.Code}
	if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil {
		t.Fatalf("readiness body %q: %v", w.Body.String(), err)
	}
	return r
}

// waitReady polls the readiness check until ok says its answer is the one
// awaited, and returns it.
func waitReady(t *testing.T, h http.Handler, what string, ok func(readiness) bool) readiness {
	t.Helper()
	var last readiness
	deadline := time.Now().Add(conformance.WaitTimeout)
	for {
		if last = checkReady(t, h); ok(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness never became %s; last answer: %v", what, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func hasReason(r readiness, part string) bool {
	return slices.ContainsFunc(r.Reason, func(s string) bool { return strings.Contains(s, part) })
}

// currentForwarder is the status source of a process that replaces its
// forwarder: the health handler stays mounted while instances come and
// go.
type currentForwarder struct {
	atomic.Pointer[forwarder.Forwarder]
}

func (c *currentForwarder) Status(ctx context.Context) (forwarder.Status, error) {
	return c.Load().Status(ctx)
}

// TestReadinessPostgres follows the readiness check of real forwarders:
// not ready before Run, ready while running, not ready while a message
// waits longer than MaxPendingAge (refused by the destination, or with no
// forwarder running) and after Close, and ready again once a new forwarder
// runs and drains the outbox.
func TestReadinessPostgres(t *testing.T) {
	pool := testenv.Postgres(t)
	env := pgDialectEnv(pool)
	ctx := testenv.Ctx(t, time.Minute)
	d := env.NewDialect(t)
	dest := conformance.NewRecorder()
	cfg := forwarder.Config{
		DB:                  env.DB,
		Dialect:             d,
		Destination:         dest,
		MaxAttempts:         -1,
		Retry:               forwarder.ExponentialRetry{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond},
		DelayedPollInterval: 20 * time.Millisecond,
		Source:              forwarder.Polling{PollInterval: 20 * time.Millisecond, Partitions: 4},
	}
	const maxAge = 300 * time.Millisecond
	src := &currentForwarder{}
	h := forwarder.HealthHandler(src, forwarder.HealthOptions{MaxPendingAge: maxAge})
	running := func(r readiness) bool { return r.code == http.StatusOK && r.Status == "ready" && r.Detail.Running }

	first, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	src.Store(first)
	if r := checkReady(t, h); r.code != http.StatusServiceUnavailable || !hasReason(r, "not running") {
		t.Fatalf("before Run: %v", r)
	}
	errc := make(chan error, 1)
	go func() { errc <- first.Run(context.Background()) }()
	t.Cleanup(func() { _ = first.Close() })
	if err := first.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	waitReady(t, h, "ready with every partition", func(r readiness) bool { return running(r) && len(r.Detail.Partitions) == 4 })

	// A message the destination refuses waits past the age limit while
	// the forwarder runs.
	dest.SetReject(func(string, *message.Message) error { return errTooLarge })
	publishKeyed(t, ctx, env.DB, d, "orders", "customer-1")
	r := waitReady(t, h, "not ready for the age limit", func(r readiness) bool { return r.code == http.StatusServiceUnavailable })
	if !r.Detail.Running || len(r.Reason) != 1 || !hasReason(r, "oldest pending message") || r.Detail.Pending != 1 {
		t.Fatalf("past the age limit while running: %v", r)
	}
	dest.SetReject(nil)
	waitReady(t, h, "ready once the message is sent", func(r readiness) bool { return running(r) && r.Detail.Pending == 0 })

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if r := checkReady(t, h); r.code != http.StatusServiceUnavailable || r.Detail.Running || !hasReason(r, "not running") {
		t.Fatalf("after Close: %v", r)
	}

	// With no forwarder running, a new message ages past the limit.
	publishKeyed(t, ctx, env.DB, d, "orders", "customer-2")
	r = waitReady(t, h, "not ready for the age limit", func(r readiness) bool { return hasReason(r, "oldest pending message") })
	if r.code != http.StatusServiceUnavailable || !hasReason(r, "not running") || r.Detail.Pending != 1 {
		t.Fatalf("past the age limit with no forwarder: %v", r)
	}

	// A new forwarder takes over and drains the outbox.
	second := conformance.StartForwarder(t, cfg)
	src.Store(second)
	waitReady(t, h, "ready with a new forwarder", func(r readiness) bool { return running(r) && r.Detail.Pending == 0 && len(r.Reason) == 0 })
	if dest.Distinct() != 2 {
		t.Fatalf("%d messages delivered, want 2", dest.Distinct())
	}
}
