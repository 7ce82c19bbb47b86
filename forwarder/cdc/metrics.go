package cdc

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/millbox/millbox/forwarder"
)

// Metric names of the gauges the active reader reports.
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
func (f *Forwarder) registerGauges() (func(), error) {
	mp := f.cfg.Telemetry.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter("github.com/millbox/millbox/forwarder/cdc")
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
	table := f.names.table
	if f.names.schema != "" {
		table = f.names.schema + "." + table
	}
	attrs := metric.WithAttributes(AttrSlot.String(f.cfg.Slot), forwarder.AttrOutboxTable.String(table))
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if !f.active.Load() {
			return nil
		}
		if oldest := f.oldest.Load(); oldest > 0 {
			o.ObserveFloat64(age, max(time.Since(time.Unix(0, oldest)).Seconds(), 0), attrs)
		} else {
			o.ObserveFloat64(age, 0, attrs)
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		rows, err := f.cfg.DB.Query(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1 AND confirmed_flush_lsn IS NOT NULL`, f.cfg.Slot)
		if err != nil {
			return err
		}
		defer rows.Close()
		if rows.Next() {
			var v int64
			if err := rows.Scan(&v); err != nil {
				return err
			}
			o.ObserveInt64(lag, v, attrs)
		}
		return rows.Err()
	}, lag, age)
	if err != nil {
		return nil, err
	}
	return func() { _ = reg.Unregister() }, nil
}
