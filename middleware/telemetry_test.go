package middleware

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// producedMessage returns a message carrying the trace context of a new
// producer span, and that span's context.
func producedMessage(t *testing.T, tp trace.TracerProvider) (*message.Message, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /orders")
	defer span.End()
	msg := message.NewMessage("1", nil)
	propagation.TraceContext{}.Inject(ctx, propagation.MapCarrier(msg.Metadata))
	return msg, span.SpanContext()
}

func TestProcessSpanParents(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	it, err := newInboxTelemetry(Telemetry{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}

	// Without a span in the message's context, the producer's is the parent.
	msg, producer := producedMessage(t, tp)
	ctx, p := it.start(msg.Context(), msg, "billing")
	if got := trace.SpanContextFromContext(ctx); got.TraceID() != producer.TraceID() {
		t.Fatalf("handler context in trace %s, want %s", got.TraceID(), producer.TraceID())
	}
	p.end(ctx, "", nil)
	s := spans.Ended()[len(spans.Ended())-1]
	if s.Parent().SpanID() != producer.SpanID() || len(s.Links()) != 0 {
		t.Fatalf("parent %s links %d, want child of %s", s.Parent().SpanID(), len(s.Links()), producer.SpanID())
	}

	// A router's tracing middleware already started a span: it stays the
	// parent, and the producer's span is linked.
	msg, producer = producedMessage(t, tp)
	routerCtx, routerSpan := tp.Tracer("router").Start(context.Background(), "router handler")
	ctx, p = it.start(routerCtx, msg, "billing")
	p.end(ctx, ErrorClassHandler, nil)
	routerSpan.End()
	var process sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.Name() == "process" && s.Parent().SpanID() == routerSpan.SpanContext().SpanID() {
			process = s
		}
	}
	if process == nil {
		t.Fatal("no process span under the router's span")
	}
	if len(process.Links()) != 1 || process.Links()[0].SpanContext.SpanID() != producer.SpanID() {
		t.Fatalf("links %v, want the producer %s", process.Links(), producer.SpanID())
	}
}
