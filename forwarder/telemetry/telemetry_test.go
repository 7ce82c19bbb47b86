package telemetry

import (
	"context"
	"errors"
	"fmt"
	"github.com/millbox/millbox/forwarder/destination"
	"net"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/millbox/millbox/sqladapters/postgres"
)

// telemetryFixture is a telemetry reporting to an in-memory SDK.
type telemetryFixture struct {
	tel    *Recorder
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
}

func newTelemetryFixture(t *testing.T) *telemetryFixture {
	t.Helper()
	f := &telemetryFixture{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = f.tp.Shutdown(context.Background())
	})
	d := postgres.MustNew(postgres.Options{Schema: "shop", OutboxTable: "events"})
	var err error
	f.tel, err = NewRecorder(Config{MeterProvider: mp, TracerProvider: f.tp, MessagingSystem: "kafka"}, d)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// collect returns the data points of each metric by name.
func (f *telemetryFixture) collect(t *testing.T) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// attrKey renders an attribute set for comparisons.
func attrKey(s attribute.Set) string {
	return s.Encoded(attribute.DefaultEncoder())
}

func wantAttrs(kv ...attribute.KeyValue) string {
	return attrKey(attribute.NewSet(kv...))
}

var sendAttrs = []attribute.KeyValue{
	attribute.String("millbox.outbox.table", "shop.events"),
	attribute.String("messaging.system", "kafka"),
	attribute.String("messaging.operation.name", "send"),
}

func sendTo(topic string, extra ...attribute.KeyValue) string {
	kv := append(append([]attribute.KeyValue{}, sendAttrs...), attribute.String("messaging.destination.name", topic))
	return wantAttrs(append(kv, extra...)...)
}

func sums(t *testing.T, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	s, ok := a.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("want an int64 sum, got %T", a)
	}
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		out[attrKey(dp.Attributes)] = dp.Value
	}
	return out
}

func TestTelemetryCountsSentAndFailedByTopicAndErrorClass(t *testing.T) {
	f := newTelemetryFixture(t)
	ctx := context.Background()
	f.tel.Sent(ctx, "orders", 3)
	f.tel.Sent(ctx, "orders", 2)
	f.tel.Sent(ctx, "payments", 1)
	f.tel.Sent(ctx, "payments", 0)
	f.tel.Failed(ctx, "orders", 2, fmt.Errorf("publish: %w", context.DeadlineExceeded))
	f.tel.Failed(ctx, "orders", 1, errors.New("broker said no"))
	f.tel.Failed(ctx, "payments", 1, &net.OpError{Op: "dial", Err: errors.New("connection refused")})
	f.tel.DeadLettered(ctx, "orders", 1)

	m := f.collect(t)
	got := sums(t, m[MetricSentMessages])
	want := map[string]int64{
		sendTo("orders"):   5,
		sendTo("payments"): 1,
		sendTo("orders", attribute.String("error.type", ErrorClassTimeout)):                  2,
		sendTo("orders", attribute.String("error.type", ErrorClassPublish)):                  1,
		sendTo("payments", attribute.String("error.type", ErrorClassDestinationUnavailable)): 1,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("sent messages\n got %v\nwant %v", got, want)
	}
	if got := sums(t, m[MetricDeadLettered]); got[sendTo("orders")] != 1 || len(got) != 1 {
		t.Fatalf("dead lettered: %v", got)
	}
	// Nothing in any attribute set may identify a message.
	for name, a := range m {
		if s, ok := a.(metricdata.Sum[int64]); ok {
			for _, dp := range s.DataPoints {
				for _, kv := range dp.Attributes.ToSlice() {
					switch kv.Key {
					case "millbox.outbox.table", "messaging.system", "messaging.operation.name",
						"messaging.destination.name", "error.type":
					default:
						t.Errorf("%s has unexpected attribute %s", name, kv.Key)
					}
				}
			}
		}
	}
}

func TestTelemetryRecordsDurationsAndBatchSizes(t *testing.T) {
	f := newTelemetryFixture(t)
	ctx := context.Background()
	f.tel.PublishDuration(ctx, "orders", 20*time.Millisecond, nil)
	f.tel.PublishDuration(ctx, "orders", 3*time.Second, context.DeadlineExceeded)
	f.tel.CommitToAck(ctx, "orders", 150*time.Millisecond)
	f.tel.CommitToAck(ctx, "orders", 250*time.Millisecond)
	f.tel.BatchSize(ctx, 100)
	f.tel.BatchSize(ctx, 7)

	m := f.collect(t)
	ops := m[MetricOperationDuration].(metricdata.Histogram[float64])
	byAttrs := map[string]metricdata.HistogramDataPoint[float64]{}
	for _, dp := range ops.DataPoints {
		byAttrs[attrKey(dp.Attributes)] = dp
	}
	if dp := byAttrs[sendTo("orders")]; dp.Count != 1 || dp.Sum != 0.02 {
		t.Errorf("successful publish duration: %+v", dp)
	}
	if dp := byAttrs[sendTo("orders", attribute.String("error.type", ErrorClassTimeout))]; dp.Count != 1 || dp.Sum != 3 {
		t.Errorf("failed publish duration: %+v", dp)
	}
	c2a := m[MetricCommitToAck].(metricdata.Histogram[float64])
	if len(c2a.DataPoints) != 1 || c2a.DataPoints[0].Count != 2 || c2a.DataPoints[0].Sum != 0.4 {
		t.Errorf("commit to ack: %+v", c2a.DataPoints)
	}
	bs := m[MetricBatchSize].(metricdata.Histogram[int64])
	if len(bs.DataPoints) != 1 || bs.DataPoints[0].Count != 2 || bs.DataPoints[0].Sum != 107 {
		t.Errorf("batch size: %+v", bs.DataPoints)
	}
	if got, want := attrKey(bs.DataPoints[0].Attributes), wantAttrs(sendAttrs[:2]...); got != want {
		t.Errorf("batch size attributes %s, want %s", got, want)
	}
}

func TestTelemetryObservesRunningAndPartitionsUntilClosed(t *testing.T) {
	f := newTelemetryFixture(t)
	running, partitions := true, 4
	if err := f.tel.Observe(func() bool { return running }, func() int { return partitions }); err != nil {
		t.Fatal(err)
	}
	gauge := func(m map[string]metricdata.Aggregation, name string) (int64, bool) {
		g, ok := m[name].(metricdata.Gauge[int64])
		if !ok || len(g.DataPoints) == 0 {
			return 0, false
		}
		return g.DataPoints[0].Value, true
	}
	m := f.collect(t)
	if v, _ := gauge(m, MetricRunning); v != 1 {
		t.Errorf("running = %d, want 1", v)
	}
	if v, _ := gauge(m, MetricPartitions); v != 4 {
		t.Errorf("partitions = %d, want 4", v)
	}
	running, partitions = false, 0
	m = f.collect(t)
	if v, _ := gauge(m, MetricRunning); v != 0 {
		t.Errorf("running = %d after stop, want 0", v)
	}
	if err := f.tel.Close(); err != nil {
		t.Fatal(err)
	}
	m = f.collect(t)
	if _, ok := gauge(m, MetricRunning); ok {
		t.Error("a closed forwarder is still reported")
	}
}

func TestTelemetryHealthRemembersLastPublishAndError(t *testing.T) {
	f := newTelemetryFixture(t)
	if last, lastErr, lastErrAt := f.tel.Health(); !last.IsZero() || lastErr != "" || !lastErrAt.IsZero() {
		t.Fatalf("fresh recorder has history: %v %q %v", last, lastErr, lastErrAt)
	}
	before := time.Now()
	f.tel.Sent(context.Background(), "orders", 1)
	f.tel.Failed(context.Background(), "orders", 1, errors.New("broker down"))
	if last, lastErr, lastErrAt := f.tel.Health(); last.Before(before) || lastErr != "broker down" || lastErrAt.Before(before) {
		t.Fatalf("health: %v %q %v", last, lastErr, lastErrAt)
	}
}

func TestErrorClass(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), ErrorClassTimeout},
		{context.Canceled, ErrorClassCanceled},
		{fmt.Errorf("%w: too big", destination.ErrInvalidMessage), ErrorClassInvalidMessage},
		{&net.OpError{Op: "dial", Err: errors.New("refused")}, ErrorClassDestinationUnavailable},
		{fmt.Errorf("kafka: %w", destination.ErrDestinationUnavailable), ErrorClassDestinationUnavailable},
		{errors.New("kafka: out of brokers"), ErrorClassPublish},
	} {
		if got := ErrorClass(c.err); got != c.want {
			t.Errorf("ErrorClass(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// producerMessage returns a message whose metadata carries the context of
// a new span of tp, as Publish stores it, and that span's context.
func producerMessage(t *testing.T, tp trace.TracerProvider, name string) (*message.Message, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(context.Background(), name)
	defer span.End()
	msg := message.NewMessage(name, []byte("{}"))
	msg.SetContext(ctx)
	InjectTrace(DefaultPropagator(), []*message.Message{msg})
	if msg.Metadata.Get("traceparent") == "" {
		t.Fatal("no traceparent stored")
	}
	return msg, span.SpanContext()
}

func TestStartSendContinuesTheProducerTraceOfASingleMessage(t *testing.T) {
	f := newTelemetryFixture(t)
	msg, producer := producerMessage(t, f.tp, "checkout")
	ctx, end := f.tel.StartSend(context.Background(), "orders", []*message.Message{msg})
	if got := trace.SpanContextFromContext(ctx); got.TraceID() != producer.TraceID() {
		t.Fatalf("send context is in trace %s, want %s", got.TraceID(), producer.TraceID())
	}
	end(nil)
	var send sdktrace.ReadOnlySpan
	for _, s := range f.spans.Ended() {
		if s.Name() == "send orders" {
			send = s
		}
	}
	if send == nil {
		t.Fatal("no send span")
	}
	if send.Parent().SpanID() != producer.SpanID() || send.SpanKind() != trace.SpanKindProducer {
		t.Fatalf("send span parent %s kind %s, want child of %s, producer kind", send.Parent().SpanID(), send.SpanKind(), producer.SpanID())
	}
	attrs := attribute.NewSet(send.Attributes()...)
	for k, want := range map[attribute.Key]string{
		"messaging.system":           "kafka",
		"messaging.destination.name": "orders",
		"messaging.operation.type":   "send",
		"millbox.outbox.table":       "shop.events",
	} {
		if v, _ := attrs.Value(k); v.AsString() != want {
			t.Errorf("%s = %q, want %q", k, v.AsString(), want)
		}
	}
	if msg.Metadata.Get("traceparent") == "" {
		t.Error("startSend removed the producer's trace context")
	}
}

func TestStartSendLinksEveryProducerOfAMixedBatch(t *testing.T) {
	f := newTelemetryFixture(t)
	a, scA := producerMessage(t, f.tp, "a")
	b, scB := producerMessage(t, f.tp, "b")
	plain := message.NewMessage("plain", nil)
	_, end := f.tel.StartSend(context.Background(), "orders", []*message.Message{a, plain, b})
	end(fmt.Errorf("publish: %w", context.DeadlineExceeded))

	var send sdktrace.ReadOnlySpan
	for _, s := range f.spans.Ended() {
		if s.Name() == "send orders" {
			send = s
		}
	}
	if send == nil {
		t.Fatal("no send span")
	}
	if send.Parent().IsValid() {
		t.Errorf("a batch of several traces has parent %s", send.Parent().SpanID())
	}
	var linked []trace.SpanID
	for _, l := range send.Links() {
		linked = append(linked, l.SpanContext.SpanID())
	}
	if fmt.Sprint(linked) != fmt.Sprint([]trace.SpanID{scA.SpanID(), scB.SpanID()}) {
		t.Errorf("links %v, want %v and %v", linked, scA.SpanID(), scB.SpanID())
	}
	if send.Status().Code != codes.Error {
		t.Errorf("status %v, want error", send.Status())
	}
	attrs := attribute.NewSet(send.Attributes()...)
	if v, _ := attrs.Value("error.type"); v.AsString() != ErrorClassTimeout {
		t.Errorf("error.type = %q", v.AsString())
	}
	if v, _ := attrs.Value("messaging.batch.message_count"); v.AsInt64() != 3 {
		t.Errorf("batch count = %d", v.AsInt64())
	}
}

func TestInjectTraceKeepsUpstreamContextWhenTheMessageHasNone(t *testing.T) {
	msg := message.NewMessage("1", nil)
	msg.Metadata.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	InjectTrace(DefaultPropagator(), []*message.Message{msg, nil})
	if got := msg.Metadata.Get("traceparent"); got != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("traceparent overwritten with %q", got)
	}
	// An empty composite propagator stores nothing.
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("test").Start(context.Background(), "x")
	defer span.End()
	quiet := message.NewMessage("2", nil)
	quiet.SetContext(ctx)
	InjectTrace(propagation.NewCompositeTextMapPropagator(), []*message.Message{quiet})
	if len(quiet.Metadata) != 0 {
		t.Fatalf("metadata %v, want none", quiet.Metadata)
	}
}

// TestTelemetryInstrumentUnits pins the kind and unit of every forwarder
// instrument: the Prometheus exporter derives series names from them
// (unit "s" adds _seconds, counters _total), and dashboards and alerts use
// those names.
func TestTelemetryInstrumentUnits(t *testing.T) {
	f := newTelemetryFixture(t)
	ctx := context.Background()
	f.tel.Sent(ctx, "orders", 1)
	f.tel.DeadLettered(ctx, "orders", 1)
	f.tel.PublishDuration(ctx, "orders", time.Millisecond, nil)
	f.tel.CommitToAck(ctx, "orders", time.Millisecond)
	f.tel.BatchSize(ctx, 1)
	if err := f.tel.Observe(func() bool { return true }, func() int { return 1 }); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			got[m.Name] = fmt.Sprintf("%T %s", m.Data, m.Unit)
		}
	}
	want := map[string]string{
		MetricSentMessages:      "metricdata.Sum[int64] {message}",
		MetricDeadLettered:      "metricdata.Sum[int64] {message}",
		MetricOperationDuration: "metricdata.Histogram[float64] s",
		MetricCommitToAck:       "metricdata.Histogram[float64] s",
		MetricBatchSize:         "metricdata.Histogram[int64] {message}",
		MetricRunning:           "metricdata.Gauge[int64] {instance}",
		MetricPartitions:        "metricdata.Gauge[int64] {partition}",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("instruments\n got %v\nwant %v", got, want)
	}
}

// countingPropagator counts the trace contexts read from messages.
type countingPropagator struct {
	propagation.TextMapPropagator
	extracts int
}

func (p *countingPropagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	p.extracts++
	return p.TextMapPropagator.Extract(ctx, c)
}

// Without an SDK (the global providers of a program that installed none,
// or no-op ones) a send reads no trace context from its messages; with
// one it reads each producer's context once, not once per message.
func TestStartSendReadsNoTraceContextWithoutAnSDK(t *testing.T) {
	d := postgres.MustNew(postgres.Options{})
	traced := make([]*message.Message, 50)
	sdk := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
	ctx, span := sdk.Tracer("producer").Start(context.Background(), "request")
	for i := range traced {
		m := message.NewMessage(fmt.Sprint(i), nil)
		propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(m.Metadata))
		traced[i] = m
	}
	span.End()
	for name, c := range map[string]struct {
		tp   trace.TracerProvider
		want int
	}{
		"global, no SDK installed": {nil, 0},
		"no-op":                    {nooptrace.NewTracerProvider(), 0},
		"SDK":                      {sdk, 1},
	} {
		prop := &countingPropagator{TextMapPropagator: propagation.TraceContext{}}
		tel, err := NewRecorder(Config{TracerProvider: c.tp, Propagator: prop}, d)
		if err != nil {
			t.Fatal(err)
		}
		_, end := tel.StartSend(context.Background(), "t", traced)
		end(nil)
		if prop.extracts != c.want {
			t.Errorf("%s: %d trace contexts read for a call of %d messages of one producer, want %d", name, prop.extracts, len(traced), c.want)
		}
	}
}
