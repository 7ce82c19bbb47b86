package telemetry

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/millbox/millbox/sqladapters"
)

const (
	// DefaultOutboxMetricsInterval is the shortest time between two reads
	// of the outbox by RegisterOutboxMetrics.
	DefaultOutboxMetricsInterval = 5 * time.Second
	// DefaultOutboxMetricsTimeout bounds one read of the outbox by
	// RegisterOutboxMetrics.
	DefaultOutboxMetricsTimeout = 5 * time.Second
)

// OutboxMetricsOptions configures RegisterOutboxMetrics.
type OutboxMetricsOptions struct {
	// MinInterval is the shortest time between two reads of the outbox:
	// collections in between report the last read, so that many scrapers
	// or a scrape storm cost at most one query per interval. Defaults to
	// DefaultOutboxMetricsInterval.
	MinInterval time.Duration
	// Timeout bounds one read. Defaults to DefaultOutboxMetricsTimeout.
	Timeout time.Duration
	// Logger receives failed reads as errors. Defaults to log/slog's
	// default logger.
	Logger watermill.LoggerAdapter
}

// Validate names the first invalid field.
func (o OutboxMetricsOptions) Validate() error {
	switch {
	case o.MinInterval < 0:
		return fmt.Errorf("%w: OutboxMetricsOptions.MinInterval %v must not be negative", sqladapters.ErrInvalidConfig, o.MinInterval)
	case o.Timeout < 0:
		return fmt.Errorf("%w: OutboxMetricsOptions.Timeout %v must not be negative", sqladapters.ErrInvalidConfig, o.Timeout)
	}
	return nil
}

// RegisterOutboxMetrics reports the outbox of d as four observable gauges
// of mp (otel.GetMeterProvider() when nil), with the attribute
// millbox.outbox.table: MetricOutboxPending, MetricOutboxOldestPendingAge,
// MetricOutboxDeadLetters, MetricOutboxHeldKeys and MetricOutboxScheduled.
// Each collection runs at most one cheap statement on db
// (sqladapters.Dialect.OutboxStats), and none when the last read is
// younger than MinInterval. A failed read is logged and its
// collection reports nothing for this outbox.
//
// The gauges do not depend on a forwarder: register them once per outbox
// in any process (a forwarder, the application, an admin service), so
// that a backlog stays visible when no forwarder runs. Several processes
// reporting the same outbox report the same values; aggregate them with
// max. Call unregister to stop.
func RegisterOutboxMetrics(mp metric.MeterProvider, db sqladapters.Executor, d sqladapters.Dialect, opts OutboxMetricsOptions) (unregister func() error, err error) {
	if db == nil || d == nil {
		return nil, fmt.Errorf("%w: RegisterOutboxMetrics needs a database and a dialect", sqladapters.ErrInvalidConfig)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = watermill.NewSlogLogger(nil)
	}
	r := newOutboxReader(db, d, opts.MinInterval, opts.Timeout)
	meter := mp.Meter(instrumentationName)
	pending, err1 := meter.Int64ObservableGauge(MetricOutboxPending,
		metric.WithUnit("{message}"),
		metric.WithDescription("Pending rows in the outbox, rows waiting for a retry included."))
	age, err2 := meter.Float64ObservableGauge(MetricOutboxOldestPendingAge,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest pending row in the outbox; 0 when nothing is pending."))
	dead, err3 := meter.Int64ObservableGauge(MetricOutboxDeadLetters,
		metric.WithUnit("{message}"),
		metric.WithDescription("Dead letters of the outbox: rows that exhausted their attempts."))
	held, err4 := meter.Int64ObservableGauge(MetricOutboxHeldKeys,
		metric.WithUnit("{key}"),
		metric.WithDescription("Ordering keys held by a dead letter: their later messages wait until it is requeued or discarded."))
	scheduled, err5 := meter.Int64ObservableGauge(MetricOutboxScheduled,
		metric.WithUnit("{message}"),
		metric.WithDescription("Scheduled messages of the outbox: delayed messages waiting for their due time."))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		return nil, err
	}
	attrs := metric.WithAttributes(AttrOutboxTable.String(TableLabel(d)))
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		s, fresh, err := r.read(ctx)
		if err != nil {
			if fresh {
				opts.Logger.Error("Cannot read the outbox for metrics", err, watermill.LogFields{"table": TableLabel(d)})
			}
			return nil
		}
		o.ObserveInt64(pending, s.Pending, attrs)
		o.ObserveInt64(dead, s.Dead, attrs)
		o.ObserveInt64(held, s.HeldKeys, attrs)
		o.ObserveInt64(scheduled, s.Scheduled, attrs)
		o.ObserveFloat64(age, s.OldestPendingAge.Seconds(), attrs)
		return nil
	}, pending, age, dead, held, scheduled)
	if err != nil {
		return nil, err
	}
	return reg.Unregister, nil
}

// outboxReader reads the outbox's stats at most once per interval and
// shares the result between its callers.
type outboxReader struct {
	db       sqladapters.Executor
	d        sqladapters.Dialect
	interval time.Duration
	timeout  time.Duration

	mu    sync.Mutex // guards the read and its result; held during the query so callers share it
	at    time.Time  // when the last read ended; zero before the first
	stats sqladapters.OutboxStats
	err   error
}

func newOutboxReader(db sqladapters.Executor, d sqladapters.Dialect, interval, timeout time.Duration) *outboxReader {
	return &outboxReader{
		db:       db,
		d:        d,
		interval: cmp.Or(interval, DefaultOutboxMetricsInterval),
		timeout:  cmp.Or(timeout, DefaultOutboxMetricsTimeout),
	}
}

// read returns the last result when it is younger than the interval, and
// reads the outbox otherwise; fresh reports the latter. A failure is
// cached too, so a struggling database is not asked again at once.
func (r *outboxReader) read(ctx context.Context) (s sqladapters.OutboxStats, fresh bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < r.interval {
		return r.stats, false, r.err
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	r.stats, r.err = r.d.OutboxStats(ctx, r.db)
	r.at = time.Now()
	return r.stats, true, r.err
}
