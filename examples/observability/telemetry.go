package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// telemetry is the OpenTelemetry SDK of the example: metrics exported to a
// Prometheus registry, spans kept for the trace it prints.
type telemetry struct {
	metricsHandler http.Handler
	traces         *traceLog
	shutdown       func()
}

// setupTelemetry installs global meter and tracer providers and the W3C
// propagator, which millbox's components use when their Telemetry is left
// empty. An application would send spans to its collector with an OTLP
// exporter (sdktrace.WithBatcher) instead of keeping them.
func setupTelemetry() (*telemetry, error) {
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	traces := &traceLog{}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(traces))
	otel.SetMeterProvider(mp)
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return &telemetry{
		metricsHandler: promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
		traces:         traces,
		shutdown: func() {
			_ = tp.Shutdown(context.Background())
			_ = mp.Shutdown(context.Background())
		},
	}, nil
}

func (t *telemetry) printTrace() { t.traces.print() }

// traceLog keeps the spans of the latest traced order: the request that
// placed it, and whatever continued its trace.
type traceLog struct {
	mu    sync.Mutex
	id    trace.TraceID
	spans []sdktrace.ReadOnlySpan
}

func (l *traceLog) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

func (l *traceLog) OnEnd(s sdktrace.ReadOnlySpan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !s.Parent().IsValid() && s.Name() == "POST /orders" && (!l.id.IsValid() || len(l.spans) > 1) {
		// A new request, once the previous one's trace has continued.
		l.id, l.spans = s.SpanContext().TraceID(), nil
	}
	if s.SpanContext().TraceID() == l.id && len(l.spans) < 16 {
		l.spans = append(l.spans, s)
	}
}

func (l *traceLog) Shutdown(context.Context) error   { return nil }
func (l *traceLog) ForceFlush(context.Context) error { return nil }

func (l *traceLog) print() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.spans) == 0 {
		return
	}
	fmt.Printf("trace %s:\n", l.id)
	for _, s := range l.spans {
		var attrs []string
		for _, kv := range s.Attributes() {
			attrs = append(attrs, string(kv.Key)+"="+kv.Value.Emit())
		}
		parent := "root"
		if s.Parent().IsValid() {
			parent = "child of " + s.Parent().SpanID().String()
		}
		fmt.Printf("  %-28s span %s %s, %s %s\n", s.Name(), s.SpanContext().SpanID(), parent, s.SpanKind(), strings.Join(attrs, " "))
	}
}
