package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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
	pending, dead int64
	age           float64
	table         string
	found         bool
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
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(`{}`))
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
	if _, err := d.RecordFailure(sqladapters.Failure{ID: rows[0].ID, Attempts: 3, Error: "broker down", Dead: true}).Exec(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.pending != n-1 || g.dead != 1 {
		t.Fatalf("after a dead letter: %+v", g)
	}
	ids := make([]int64, 0, n-1)
	for _, r := range rows[1:] {
		ids = append(ids, r.ID)
	}
	if _, err := d.CompleteForwarded(ids, false).Exec(ctx, env.DB); err != nil {
		t.Fatal(err)
	}
	if g = collectOutboxGauges(t, reader); g.pending != 0 || g.dead != 1 || g.age != 0 {
		t.Fatalf("after draining: %+v", g)
	}
	stats, err := forwarder.ReadOutboxStats(ctx, env.DB, d)
	if err != nil {
		t.Fatal(err)
	}
	backlog, err := forwarder.OutboxBacklog(ctx, env.DB, d)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Backlog != backlog || stats.OldestPendingAge != 0 {
		t.Fatalf("stats %+v disagree with backlog %+v", stats, backlog)
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
// it through the inbox middleware: the handler runs in the request's trace,
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
			conformance.StartForwarder(t, forwarder.Config{DB: env.DB, Dialect: d, Publisher: b.pub})

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
		})
	}
}
