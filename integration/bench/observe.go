package main

import (
	"context"
	crand "crypto/rand"
	stdsql "database/sql"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	nooptrace "go.opentelemetry.io/otel/trace/noop"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("observe", "drain N prefilled messages (200 keys, traced producers) to a counting publisher with telemetry off and on (OpenTelemetry SDK, discarding exporters)", runObserve)
}

// observePairs is how many off/on pairs run, alternating, so that a
// machine whose load drifts during the run weighs on both sides.
const observePairs = 3

// observeInterval is how often the metrics are collected with telemetry
// on: far more often than a Prometheus scrape, so that collection shows
// in the cost.
const observeInterval = time.Second

func runObserve(ctx context.Context, o options) error {
	n := orDefault(o.n, 100000)
	fmt.Printf("draining %d messages (200 keys, 256-byte payloads, each with its producer's trace context) from Postgres to a counting publisher\n", n)
	fmt.Printf("off: no-op meter and tracer providers; on: SDK meter (collected every %v, outbox gauges registered) and tracer (always sample, batch processor), both exporting to a discard\n", observeInterval)
	var off, on, offCPU, onCPU, pairs []float64
	for i := range 2 * observePairs {
		enabled := i%2 == 1
		r, err := observeOnce(ctx, o, n, enabled)
		if err != nil {
			return err
		}
		cpu := float64(r.cpu.Microseconds()) / float64(n)
		if enabled {
			on, onCPU = append(on, r.rate), append(onCPU, cpu)
			pairs = append(pairs, r.rate/off[len(off)-1])
			fmt.Printf("telemetry on:  %8.0f msg/s  %5.2f µs CPU/msg  (%d metric exports, %d spans exported)\n", r.rate, cpu, r.exports, r.spans)
		} else {
			off, offCPU = append(off, r.rate), append(offCPU, cpu)
			fmt.Printf("telemetry off: %8.0f msg/s  %5.2f µs CPU/msg\n", r.rate, cpu)
		}
	}
	offMed, onMed := median(off), median(on)
	fmt.Printf("on/off by pair: %.2f\n", pairs)
	summary("observe_off_msgs_per_s", int(offMed), "observe_on_msgs_per_s", int(onMed),
		"observe_off_cpu_us_per_msg", median(offCPU), "observe_on_cpu_us_per_msg", median(onCPU),
		"observe_overhead_ratio", onMed/offMed)
	return nil
}

// observeResult is one drain.
type observeResult struct {
	rate float64
	// cpu is the process's CPU time (user and system) during the drain:
	// on a loaded machine it varies less than the rate.
	cpu            time.Duration
	exports, spans int64
}

// observeOnce prefills a fresh outbox and drains it with one forwarder,
// with telemetry on or off.
func observeOnce(ctx context.Context, o options, n int, enabled bool) (observeResult, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return observeResult{}, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefillTraced(ctx, db, d, n, 200, 256); err != nil {
		return observeResult{}, err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return observeResult{}, err
	}

	tel := forwarder.Telemetry{
		MeterProvider:  noopmetric.NewMeterProvider(),
		TracerProvider: nooptrace.NewTracerProvider(),
	}
	metrics, spans := &discardMetrics{}, &discardSpans{}
	// shutdown flushes the SDK after the drain, outside the timing, so
	// that the exporters' counts are complete.
	shutdown := func() {}
	if enabled {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(
			sdkmetric.NewPeriodicReader(metrics, sdkmetric.WithInterval(observeInterval))))
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		unregister, err := forwarder.RegisterOutboxMetrics(mp, db, d, forwarder.OutboxMetricsOptions{Logger: watermill.NopLogger{}})
		if err != nil {
			return observeResult{}, err
		}
		var once sync.Once
		shutdown = func() {
			once.Do(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = unregister()
				_ = mp.Shutdown(sctx)
				_ = tp.Shutdown(sctx)
			})
		}
		defer shutdown()
		tel = forwarder.Telemetry{MeterProvider: mp, TracerProvider: tp, MessagingSystem: "kafka"}
	}
	dest := newCounting(n)
	cpu0 := processCPU()
	per, err := millboxForward(ctx, forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: dest,
		BatchSize:   o.batch,
		Concurrency: o.concurrency,
		Telemetry:   tel,
	}, dest.all)
	if err != nil {
		return observeResult{}, err
	}
	cpu := processCPU() - cpu0
	shutdown()
	return observeResult{rate: per * float64(n), cpu: cpu, exports: metrics.exports.Load(), spans: spans.spans.Load()}, nil
}

// prefillTraced is prefill with every message written inside a sampled
// span of its own, as when each message comes from a traced request: its
// metadata carries a traceparent, which the forwarder reads to parent or
// link its send span.
func prefillTraced(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, n, keys, payload int) error {
	body := make([]byte, payload)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	const perTx = 5000
	for done := 0; done < n; done += perTx {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return err
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			return err
		}
		msgs := make([]*message.Message, 0, perTx)
		for i := done; i < min(done+perTx, n); i++ {
			m := message.NewMessage(watermill.NewUUID(), body)
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%keys))
			m.Metadata.Set("seq", strconv.Itoa(i/keys))
			m.SetContext(trace.ContextWithSpanContext(ctx, randomSpanContext()))
			msgs = append(msgs, m)
		}
		if err := pub.Publish("bench", msgs...); err != nil {
			sqladapters.Rollback(tx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
	}
	return nil
}

func randomSpanContext() trace.SpanContext {
	var tid trace.TraceID
	var sid trace.SpanID
	_, _ = crand.Read(tid[:])
	_, _ = crand.Read(sid[:])
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
}

// processCPU returns the user and system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// discardMetrics is a metric exporter that drops what it is given, after
// the SDK has aggregated and collected it.
type discardMetrics struct{ exports atomic.Int64 }

func (*discardMetrics) Temporality(k sdkmetric.InstrumentKind) metricdata.Temporality {
	return sdkmetric.DefaultTemporalitySelector(k)
}

func (*discardMetrics) Aggregation(k sdkmetric.InstrumentKind) sdkmetric.Aggregation {
	return sdkmetric.DefaultAggregationSelector(k)
}

func (e *discardMetrics) Export(context.Context, *metricdata.ResourceMetrics) error {
	e.exports.Add(1)
	return nil
}

func (*discardMetrics) ForceFlush(context.Context) error { return nil }
func (*discardMetrics) Shutdown(context.Context) error   { return nil }

// discardSpans is a span exporter that drops what it is given, after the
// SDK has recorded and batched it.
type discardSpans struct{ spans atomic.Int64 }

func (e *discardSpans) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return nil
}

func (*discardSpans) Shutdown(context.Context) error { return nil }
