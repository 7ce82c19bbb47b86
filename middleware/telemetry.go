package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Metric names of the inbox middleware, from the OpenTelemetry messaging
// semantic conventions. Both carry messaging.destination.name (the topic
// the handler subscribed to), millbox.inbox.consumer,
// millbox.inbox.duplicate, and error.type when the message failed.
const (
	// MetricConsumedMessages counts the messages the middleware received:
	// processed ones, duplicates skipped (millbox.inbox.duplicate=true) and
	// failures (with error.type).
	MetricConsumedMessages = "messaging.client.consumed.messages"
	// MetricProcessDuration is the time from receipt to commit of each
	// message, in seconds.
	MetricProcessDuration = "messaging.process.duration"
)

// Attribute keys that the semantic conventions do not define.
const (
	// AttrInboxConsumer is the consumer the inbox records the message
	// under (InboxConfig.Consumer, with the handler name unless shared).
	AttrInboxConsumer = attribute.Key("millbox.inbox.consumer")
	// AttrInboxDuplicate is true for a message the inbox had seen: its
	// handler did not run.
	AttrInboxDuplicate = attribute.Key("millbox.inbox.duplicate")
)

// Error classes, the values of error.type on the inbox's metrics and
// spans.
const (
	// ErrorClassHandler is an error (or panic) of the handler.
	ErrorClassHandler = "handler"
	// ErrorClassNoMessageID is a message without a usable id
	// (ErrNoMessageID).
	ErrorClassNoMessageID = "no_message_id"
	// ErrorClassDatabase is a failure to begin, record or commit.
	ErrorClassDatabase = "database"
)

const instrumentationName = "github.com/millbox/millbox"

// Telemetry chooses where the inbox middleware reports metrics and spans,
// and how it reads the trace context from message metadata. The zero value
// uses OpenTelemetry's global providers, which do nothing until the
// application installs an SDK, and the W3C Trace Context propagator, the
// format the outbox publisher stores.
type Telemetry struct {
	// MeterProvider receives the metrics. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider receives the spans. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator reads the producer's trace context from the message
	// metadata. Defaults to propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator
	// MessagingSystem is the messaging.system attribute, such as "kafka"
	// or "rabbitmq". Defaults to "" (the attribute is left out).
	MessagingSystem string
}

// inboxTelemetry is the middleware's tracer and instruments.
type inboxTelemetry struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	system   string
	consumed metric.Int64Counter
	duration metric.Float64Histogram
}

func newInboxTelemetry(t Telemetry) (*inboxTelemetry, error) {
	if t.MeterProvider == nil {
		t.MeterProvider = otel.GetMeterProvider()
	}
	if t.TracerProvider == nil {
		t.TracerProvider = otel.GetTracerProvider()
	}
	if t.Propagator == nil {
		t.Propagator = propagation.TraceContext{}
	}
	meter := t.MeterProvider.Meter(instrumentationName)
	it := &inboxTelemetry{
		tracer: t.TracerProvider.Tracer(instrumentationName),
		prop:   t.Propagator,
		system: t.MessagingSystem,
	}
	var err1, err2 error
	it.consumed, err1 = meter.Int64Counter(MetricConsumedMessages,
		metric.WithUnit("{message}"),
		metric.WithDescription("Messages received by the inbox middleware: processed, duplicates skipped (millbox.inbox.duplicate) and failed (error.type)."))
	it.duration, err2 = meter.Float64Histogram(MetricProcessDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Time from receipt to commit of each message in the inbox middleware."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return it, nil
}

// processing is one message going through the middleware.
type processing struct {
	it        *inboxTelemetry
	span      trace.Span
	start     time.Time
	topic     string
	consumer  string
	duplicate bool
}

// start begins the process span of msg. Its parent is the span already in
// msg's context (a router's tracing middleware), linked to the producer's
// context from the metadata; without one, the producer's context itself,
// so that the handler continues the trace of the request that wrote the
// message.
func (it *inboxTelemetry) start(ctx context.Context, msg *message.Message, consumer string) (context.Context, *processing) {
	p := &processing{it: it, start: time.Now(), topic: message.SubscribeTopicFromCtx(ctx), consumer: consumer}
	var producer trace.SpanContext
	if len(msg.Metadata) > 0 {
		producer = trace.SpanContextFromContext(it.prop.Extract(context.Background(), propagation.MapCarrier(msg.Metadata)))
	}
	attrs := make([]attribute.KeyValue, 0, 5)
	if it.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(it.system))
	}
	attrs = append(attrs,
		semconv.MessagingDestinationName(p.topic),
		semconv.MessagingOperationName("process"),
		semconv.MessagingOperationTypeProcess,
		AttrInboxConsumer.String(consumer))
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	parentCtx := ctx
	if producer.IsValid() {
		if local := trace.SpanContextFromContext(ctx); local.IsValid() {
			if !local.Equal(producer) {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: producer}))
			}
		} else {
			parentCtx = trace.ContextWithRemoteSpanContext(ctx, producer)
		}
	}
	name := "process"
	if p.topic != "" {
		name += " " + p.topic
	}
	ctx, p.span = it.tracer.Start(parentCtx, name, opts...)
	return ctx, p
}

// end records the outcome: class is "" on success.
func (p *processing) end(ctx context.Context, class string, err error) {
	attrs := make([]attribute.KeyValue, 0, 6)
	if p.it.system != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(p.it.system))
	}
	attrs = append(attrs,
		semconv.MessagingDestinationName(p.topic),
		semconv.MessagingOperationName("process"),
		AttrInboxConsumer.String(p.consumer),
		AttrInboxDuplicate.Bool(p.duplicate))
	if class != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(class))
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	// The outcome is recorded after the transaction ended: ctx may be
	// cancelled by then, which must not drop the measurement.
	ctx = context.WithoutCancel(ctx)
	p.it.consumed.Add(ctx, 1, set)
	p.it.duration.Record(ctx, time.Since(p.start).Seconds(), set)

	p.span.SetAttributes(AttrInboxDuplicate.Bool(p.duplicate))
	if class != "" {
		p.span.SetAttributes(semconv.ErrorTypeKey.String(class))
		msg := class
		if err != nil {
			msg = err.Error()
		}
		p.span.SetStatus(codes.Error, msg)
	}
	p.span.End()
}
