package telemetry

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/sqladapters"
)

// Metric names. Names from the OpenTelemetry messaging semantic
// conventions are used where one exists; the others start with millbox.
// The Prometheus exporter turns dots into underscores and appends the
// unit and _total where they apply (messaging_client_sent_messages_total,
// millbox_outbox_oldest_pending_age_seconds).
const (
	// MetricSentMessages counts the messages the forwarder handed to the
	// destination publisher, by messaging.destination.name; failed
	// attempts carry error.type.
	MetricSentMessages = "messaging.client.sent.messages"
	// MetricOperationDuration is the duration of each call of the
	// destination publisher, in seconds; failed calls carry error.type.
	MetricOperationDuration = "messaging.client.operation.duration"
	// MetricCommitToAck is the time from a row's creation in the outbox to
	// the destination's acknowledgement, in seconds.
	MetricCommitToAck = "millbox.forwarder.commit_to_ack.duration"
	// MetricBatchSize is the number of rows in each batch the forwarder
	// read from the outbox.
	MetricBatchSize = "millbox.forwarder.batch.size"
	// MetricDeadLettered counts the rows the forwarder moved to the dead
	// letters, by messaging.destination.name.
	MetricDeadLettered = "millbox.forwarder.dead_lettered"
	// MetricPartitions is the number of partitions this forwarder
	// instance holds leases on.
	MetricPartitions = "millbox.forwarder.partitions"
	// MetricRunning is 1 while this forwarder instance runs, else 0.
	MetricRunning = "millbox.forwarder.running"

	// MetricOutboxPending is the number of pending rows in the outbox,
	// rows waiting for a retry included (see RegisterOutboxMetrics).
	MetricOutboxPending = "millbox.outbox.pending"
	// MetricOutboxOldestPendingAge is the age of the oldest pending row,
	// in seconds; 0 when nothing is pending.
	MetricOutboxOldestPendingAge = "millbox.outbox.oldest_pending_age"
	// MetricOutboxDeadLetters is the number of dead letters of the outbox.
	MetricOutboxDeadLetters = "millbox.outbox.dead_letters"
	// MetricOutboxHeldKeys is the number of ordering keys held by a dead
	// letter (Config.DeadLetterHoldsKey): their later messages wait until
	// it is requeued or discarded.
	MetricOutboxHeldKeys = "millbox.outbox.held_keys"
	// MetricOutboxScheduled is the number of scheduled messages: delayed
	// messages waiting for their due time, not yet pending.
	MetricOutboxScheduled = "millbox.outbox.scheduled"
)

// Attribute keys that the semantic conventions do not define.
const (
	// AttrOutboxTable names the outbox table (schema-qualified where the
	// database has schemas, without quotes) on every millbox metric.
	AttrOutboxTable = attribute.Key("millbox.outbox.table")
	// AttrTenant names the tenant a fleet's forwarder serves
	// (forwarder/fleet, Config.TenantAttribute).
	AttrTenant = attribute.Key("millbox.tenant")
)

// Error classes, the values of the error.type attribute on the
// forwarder's failed sends. They are few on purpose: an error message
// would make every failure its own time series.
const (
	// ErrorClassTimeout is a publish call that ran out of time.
	ErrorClassTimeout = "timeout"
	// ErrorClassCanceled is a publish call cancelled by shutdown.
	ErrorClassCanceled = "canceled"
	// ErrorClassInvalidMessage is a message the destination refused
	// (ErrInvalidMessage).
	ErrorClassInvalidMessage = "invalid_message"
	// ErrorClassDestinationUnavailable is an error wrapping
	// ErrDestinationUnavailable, or a network error reaching the
	// destination.
	ErrorClassDestinationUnavailable = "destination_unavailable"
	// ErrorClassPublish is any other error of the destination publisher.
	ErrorClassPublish = "publish_error"
)

// instrumentationName is the OpenTelemetry scope of millbox's meters and
// tracers.
const instrumentationName = "github.com/millbox/millbox"

// maxSendLinks caps the links of one send span, as the SDK's default
// span limits do.
const maxSendLinks = 128

// Config chooses where millbox reports metrics and spans, and how trace
// context travels in message metadata. The zero value uses OpenTelemetry's
// global providers, which do nothing until the application installs an SDK
// (otel.SetMeterProvider, otel.SetTracerProvider): a program that sets up
// OpenTelemetry once gets millbox's telemetry without further wiring, and
// one that does not pays next to nothing. To turn telemetry off for one
// component while the globals are set, pass the providers of
// go.opentelemetry.io/otel/metric/noop and go.opentelemetry.io/otel/trace/noop.
type Config struct {
	// MeterProvider receives the metrics. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives the spans. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context of each message's context into
	// its metadata at Publish, and reads it back where the message is
	// sent. Defaults to DefaultPropagator(). An empty composite
	// (propagation.NewCompositeTextMapPropagator()) stores nothing.
	Propagator propagation.TextMapPropagator
	// MessagingSystem is the messaging.system attribute of the
	// forwarder's metrics and spans: the system of the destination, such
	// as "kafka" or "rabbitmq". Defaults to "" (the attribute is left
	// out), because the destination is any message.Publisher.
	MessagingSystem string
	// Attributes are added to every metric and span of the forwarder,
	// such as the tenant a fleet's forwarder serves (forwarder/fleet sets
	// millbox.tenant). Keep their values few: each is a time series.
	// Defaults to none.
	Attributes []attribute.KeyValue
}

// DefaultPropagator returns the W3C Trace Context propagator: the
// traceparent and tracestate fields, which watermill-kafka and
// watermill-amqp carry as message headers unchanged. Baggage is left out
// by default because it would be stored in every outbox row; add
// propagation.Baggage{} to a composite to carry it.
func DefaultPropagator() propagation.TextMapPropagator {
	return propagation.TraceContext{}
}

func (t Config) withDefaults() Config {
	if t.MeterProvider == nil {
		t.MeterProvider = otel.GetMeterProvider()
	}
	if t.TracerProvider == nil {
		t.TracerProvider = otel.GetTracerProvider()
	}
	if t.Propagator == nil {
		t.Propagator = DefaultPropagator()
	}
	return t
}

// TableLabel is the outbox table without quotes: dialects validate table
// and schema names as plain identifiers, so nothing is lost.
func TableLabel(d sqladapters.Dialect) string {
	return strings.NewReplacer(`"`, "", "`", "").Replace(d.OutboxTable())
}

// InjectTrace writes the trace context of each message's context into its
// metadata. A message whose context carries no span keeps its metadata as
// it is, so a trace context set upstream (a Watermill router's tracing
// middleware) survives.
func InjectTrace(p propagation.TextMapPropagator, msgs []*message.Message) {
	for _, m := range msgs {
		if m == nil {
			continue
		}
		ctx := m.Context()
		if !trace.SpanContextFromContext(ctx).IsValid() {
			continue
		}
		if m.Metadata == nil {
			m.Metadata = make(message.Metadata)
		}
		p.Inject(ctx, propagation.MapCarrier(m.Metadata))
	}
}

// ErrorClass maps a publish error to one of the ErrorClass values.
func ErrorClass(err error) string {
	var netErr net.Error
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return ErrorClassTimeout
	case errors.Is(err, context.Canceled):
		return ErrorClassCanceled
	case errors.Is(err, destination.ErrInvalidMessage):
		return ErrorClassInvalidMessage
	case errors.Is(err, destination.ErrDestinationUnavailable):
		return ErrorClassDestinationUnavailable
	case errors.As(err, &netErr) && netErr.Timeout():
		return ErrorClassTimeout
	case failure.Unavailable(err): // the classification the breaker uses
		return ErrorClassDestinationUnavailable
	}
	return ErrorClassPublish
}

// Recorder is a forwarder's instruments, tracer and health record: the
// forwarder (and its change-data-capture source, for its own gauges)
// reports through it. Every method is safe for concurrent use and cheap
// when the providers do nothing.
type Recorder struct {
	tracer         trace.Tracer
	fields         []string // the propagator's metadata fields
	tracerProvider trace.TracerProvider
	globalTracer   bool // tracerProvider is OpenTelemetry's global one
	meter          metric.Meter
	prop           propagation.TextMapPropagator
	// base holds the attributes of every metric and span: the table and
	// the messaging system.
	base []attribute.KeyValue

	sentMessages metric.Int64Counter
	opDuration   metric.Float64Histogram
	commitToAckH metric.Float64Histogram
	batchSizeH   metric.Int64Histogram
	deadLetters  metric.Int64Counter

	// byTopic caches, per destination topic, the attribute set of
	// successful sends, so the hot path does not allocate.
	byTopic sync.Map // string → metric.MeasurementOption

	regMu sync.Mutex // guards regs
	regs  []metric.Registration

	lastPublish atomic.Int64 // unix nanoseconds of the last successful send
	errMu       sync.Mutex   // guards lastErr and lastErrAt
	lastErr     string
	lastErrAt   time.Time
}

// defaultTracerProvider is OpenTelemetry's global tracer provider before
// any application set one: it traces nothing.
var defaultTracerProvider = otel.GetTracerProvider()

// tracing tells whether spans of tp can record: not a no-op provider, and
// not the global one while no SDK is installed. Without tracing, sends
// start no span and read no trace context from the messages.
func tracing(tp trace.TracerProvider, global bool) bool {
	if global {
		tp = otel.GetTracerProvider()
		if tp == defaultTracerProvider {
			return false
		}
	}
	_, noop := tp.(nooptrace.TracerProvider)
	return !noop
}

// NewRecorder builds the instruments of the forwarder of d's outbox.
func NewRecorder(cfg Config, d sqladapters.Dialect) (*Recorder, error) {
	global := cfg.TracerProvider == nil
	cfg = cfg.withDefaults()
	t := &Recorder{
		tracerProvider: cfg.TracerProvider,
		globalTracer:   global,
		tracer:         cfg.TracerProvider.Tracer(instrumentationName),
		meter:          cfg.MeterProvider.Meter(instrumentationName),
		prop:           cfg.Propagator,
		fields:         cfg.Propagator.Fields(),
		base:           []attribute.KeyValue{AttrOutboxTable.String(TableLabel(d))},
	}
	if cfg.MessagingSystem != "" {
		t.base = append(t.base, semconv.MessagingSystemKey.String(cfg.MessagingSystem))
	}
	t.base = append(t.base, cfg.Attributes...)
	var errs [5]error
	t.sentMessages, errs[0] = t.meter.Int64Counter(MetricSentMessages,
		metric.WithUnit("{message}"),
		metric.WithDescription("Messages the forwarder handed to the destination publisher; failed attempts carry error.type."))
	t.opDuration, errs[1] = t.meter.Float64Histogram(MetricOperationDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of each call of the destination publisher."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	t.commitToAckH, errs[2] = t.meter.Float64Histogram(MetricCommitToAck,
		metric.WithUnit("s"),
		metric.WithDescription("Time from a message's write into the outbox to the destination's acknowledgement."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600))
	t.batchSizeH, errs[3] = t.meter.Int64Histogram(MetricBatchSize,
		metric.WithUnit("{message}"),
		metric.WithDescription("Rows in each batch the forwarder read from the outbox."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000))
	t.deadLetters, errs[4] = t.meter.Int64Counter(MetricDeadLettered,
		metric.WithUnit("{message}"),
		metric.WithDescription("Rows the forwarder moved to the dead letters after their last attempt."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return t, nil
}

// topicAttrs returns the measurement option of a successful send to topic.
func (t *Recorder) topicAttrs(topic string) metric.MeasurementOption {
	if o, ok := t.byTopic.Load(topic); ok {
		return o.(metric.MeasurementOption)
	}
	o := metric.WithAttributeSet(attribute.NewSet(t.attrs(topic, "")...))
	t.byTopic.Store(topic, o)
	return o
}

// attrs returns the attributes of a send to topic; class is the error
// class of a failure, "" for success.
func (t *Recorder) attrs(topic, class string) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, len(t.base)+3)
	kv = append(kv, t.base...)
	kv = append(kv,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingOperationName("send"))
	if class != "" {
		kv = append(kv, semconv.ErrorTypeKey.String(class))
	}
	return kv
}

// Sent records n messages to topic acknowledged by the destination. Call
// it after every successful publish call.
func (t *Recorder) Sent(ctx context.Context, topic string, n int) {
	if n <= 0 {
		return
	}
	t.sentMessages.Add(ctx, int64(n), t.topicAttrs(topic))
	t.lastPublish.Store(time.Now().UnixNano())
}

// Failed records n messages to topic whose publish call returned err, and
// remembers err for Status. The error is classified by ErrorClass.
func (t *Recorder) Failed(ctx context.Context, topic string, n int, err error) {
	if n <= 0 {
		return
	}
	class := ErrorClass(err)
	if class == "" {
		class = ErrorClassPublish
	}
	t.sentMessages.Add(ctx, int64(n), metric.WithAttributes(t.attrs(topic, class)...))
	if err == nil {
		err = errors.New("unknown error")
	}
	t.NoteError(err)
}

// NoteError remembers err as the last error, for Status.
func (t *Recorder) NoteError(err error) {
	t.errMu.Lock()
	t.lastErr, t.lastErrAt = failure.Text(err), time.Now()
	t.errMu.Unlock()
}

// DeadLettered records n rows of topic moved to the dead letters.
func (t *Recorder) DeadLettered(ctx context.Context, topic string, n int) {
	if n <= 0 {
		return
	}
	t.deadLetters.Add(ctx, int64(n), t.topicAttrs(topic))
}

// PublishDuration records the duration of one call of the destination
// publisher for topic; err is what the call returned.
func (t *Recorder) PublishDuration(ctx context.Context, topic string, d time.Duration, err error) {
	if err == nil {
		t.opDuration.Record(ctx, d.Seconds(), t.topicAttrs(topic))
		return
	}
	class := ErrorClass(err)
	t.opDuration.Record(ctx, d.Seconds(), metric.WithAttributes(t.attrs(topic, class)...))
}

// CommitToAck records, for one message of topic, the time from its row's
// creation to the destination's acknowledgement.
func (t *Recorder) CommitToAck(ctx context.Context, topic string, d time.Duration) {
	t.commitToAckH.Record(ctx, d.Seconds(), t.topicAttrs(topic))
}

// BatchSize records the number of rows of one read of the outbox.
func (t *Recorder) BatchSize(ctx context.Context, n int) {
	t.batchSizeH.Record(ctx, int64(n), metric.WithAttributes(t.base...))
}

// Meter is the meter of the recorder's provider, for a source's own
// instruments.
func (t *Recorder) Meter() metric.Meter { return t.meter }

// Attrs returns the attributes every forwarder metric carries: the
// outbox table and the messaging system.
func (t *Recorder) Attrs() []attribute.KeyValue { return t.base }

// Observe registers the gauges of this instance: whether it runs, and the
// partitions it holds. The functions are called at each collection, from
// the collector's goroutine: they must be quick and safe for concurrent
// use. close unregisters them.
func (t *Recorder) Observe(running func() bool, partitions func() int) error {
	up, err1 := t.meter.Int64ObservableGauge(MetricRunning,
		metric.WithUnit("{instance}"),
		metric.WithDescription("1 while this forwarder instance runs, else 0."))
	held, err2 := t.meter.Int64ObservableGauge(MetricPartitions,
		metric.WithUnit("{partition}"),
		metric.WithDescription("Partitions of the outbox this forwarder instance holds leases on."))
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	attrs := metric.WithAttributes(t.base...)
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var v int64
		if running() {
			v = 1
		}
		o.ObserveInt64(up, v, attrs)
		o.ObserveInt64(held, int64(partitions()), attrs)
		return nil
	}, up, held)
	if err != nil {
		return err
	}
	t.regMu.Lock()
	t.regs = append(t.regs, reg)
	t.regMu.Unlock()
	return nil
}

// Close unregisters the observable gauges. Call it when the forwarder
// stops, so a closed forwarder is not reported.
func (t *Recorder) Close() error {
	t.regMu.Lock()
	regs := t.regs
	t.regs = nil
	t.regMu.Unlock()
	var errs []error
	for _, r := range regs {
		errs = append(errs, r.Unregister())
	}
	return errors.Join(errs...)
}

// Health returns the last successful publish and the last error, for
// Status.
func (t *Recorder) Health() (lastPublish time.Time, lastErr string, lastErrAt time.Time) {
	if ns := t.lastPublish.Load(); ns != 0 {
		lastPublish = time.Unix(0, ns)
	}
	t.errMu.Lock()
	defer t.errMu.Unlock()
	return lastPublish, t.lastErr, t.lastErrAt
}

// rawContext returns the values of the propagator's fields in md, as one
// string: two messages with the same one carry the same context.
func (t *Recorder) rawContext(md message.Metadata) string {
	switch len(t.fields) {
	case 0:
		return ""
	case 1:
		return md[t.fields[0]]
	}
	var b strings.Builder
	for _, f := range t.fields {
		b.WriteString(md[f])
		b.WriteByte(0)
	}
	return b.String()
}

// StartSend starts the span of one publish call of msgs to topic and
// returns the context to publish with and the function that ends the span
// with the call's error.
//
// When every message carries the same producer trace context (one
// message, or a batch written by one traced request), the span is its
// child, so the producer's trace shows the send. Otherwise the span
// belongs to ctx's trace (a new one when ctx has none) and links to each
// producer context, up to 128. The messages' metadata is not changed:
// consumers continue the producer's trace, as the messaging conventions
// ask.
func (t *Recorder) StartSend(ctx context.Context, topic string, msgs []*message.Message) (context.Context, func(error)) {
	if !tracing(t.tracerProvider, t.globalTracer) {
		return ctx, func(error) {}
	}
	var parent, sc trace.SpanContext
	same := true
	var links []trace.Link
	var lastRaw string
	for i, m := range msgs {
		if m == nil || len(m.Metadata) == 0 {
			same = false
			continue
		}
		// Consecutive messages of one producer carry the same fields: the
		// context is read again only when they change.
		if raw := t.rawContext(m.Metadata); i == 0 || raw != lastRaw {
			lastRaw = raw
			sc = trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(m.Metadata)))
		}
		if !sc.IsValid() {
			same = false
			continue
		}
		switch {
		case !parent.IsValid():
			parent = sc
		case !sc.Equal(parent):
			same = false
		}
		if len(links) < maxSendLinks && (len(links) == 0 || !links[len(links)-1].SpanContext.Equal(sc)) {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := make([]attribute.KeyValue, 0, len(t.base)+4)
	attrs = append(attrs, t.base...)
	attrs = append(attrs,
		semconv.MessagingDestinationName(topic),
		semconv.MessagingOperationName("send"),
		semconv.MessagingOperationTypeSend)
	if len(msgs) > 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...)}
	if same && parent.IsValid() {
		ctx = trace.ContextWithRemoteSpanContext(ctx, parent)
	} else {
		opts = append(opts, trace.WithLinks(links...))
	}
	ctx, span := t.tracer.Start(ctx, "send "+topic, opts...)
	return ctx, func(err error) {
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(ErrorClass(err)))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
