package cdc

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names of the gauges the active reader reports, next to the
// forwarder's own (forwarder.Metric...).
const (
	// MetricSlotLag is how many bytes of WAL the slot retains:
	// pg_current_wal_lsn() - confirmed_flush_lsn.
	MetricSlotLag = "millbox.cdc.slot.lag"
	// MetricSlotAge is the time since the commit of the oldest transaction
	// the slot has not been confirmed past (0 when none waits).
	MetricSlotAge = "millbox.cdc.slot.age"
	// AttrSlot names the replication slot on the gauges.
	AttrSlot = attribute.Key("millbox.cdc.slot")
)

// registerGauges registers the slot gauges; they report while this
// instance is the active reader.
func (s *streamer) registerGauges() (func(), error) {
	meter := s.env.Meter
	lag, err := meter.Int64ObservableGauge(MetricSlotLag, metric.WithUnit("By"),
		metric.WithDescription("WAL bytes the replication slot retains beyond its confirmed position"))
	if err != nil {
		return nil, err
	}
	age, err := meter.Float64ObservableGauge(MetricSlotAge, metric.WithUnit("s"),
		metric.WithDescription("Time since the commit of the oldest transaction not yet confirmed on the slot"))
	if err != nil {
		return nil, err
	}
	attrs := metric.WithAttributes(append([]attribute.KeyValue{AttrSlot.String(s.cfg.Slot)}, s.env.Attrs...)...)
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if !s.active.Load() {
			return nil
		}
		if oldest := s.oldest.Load(); oldest > 0 {
			o.ObserveFloat64(age, max(time.Since(time.Unix(0, oldest)).Seconds(), 0), attrs)
		} else {
			o.ObserveFloat64(age, 0, attrs)
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		st, ok, err := s.lg.Slot(ctx, s.env.DB, s.cfg.Slot)
		if err != nil {
			return err
		}
		if ok {
			o.ObserveInt64(lag, st.Lag, attrs)
		}
		return nil
	}, lag, age)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}
