// Package telemetry is millbox's OpenTelemetry side of the forwarder and
// the outbox publisher: the settings (Config; forwarder.Telemetry is
// this type), the names of the metrics and attributes, how trace context
// travels in message metadata (InjectTrace, DefaultPropagator), the gauges
// of an outbox that any process may report (RegisterOutboxMetrics), and
// the Recorder through which a running forwarder reports its sends,
// failures and health.
//
// It uses the OpenTelemetry API only: nothing is recorded until the
// application installs an SDK (or passes providers). It may import the
// destination contract and sqladapters, never the forwarder.
package telemetry
