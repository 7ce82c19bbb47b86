package forwarder

import (
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/outbox"
	"github.com/millbox/millbox/forwarder/polling"
	"github.com/millbox/millbox/forwarder/telemetry"
	"github.com/millbox/millbox/sqladapters"
)

// The names of the parts the forwarder is made of, under the names users
// call them by. Each part's package documents them.

// The outbox publisher (package forwarder/outbox).
type (
	// Publisher writes messages into the outbox inside a transaction.
	Publisher = outbox.Publisher
	// PublisherConfig configures a Publisher.
	PublisherConfig = outbox.PublisherConfig
)

// NewPublisher returns a publisher bound to tx (outbox.NewPublisher).
func NewPublisher(tx sqladapters.Tx, cfg PublisherConfig) (*Publisher, error) {
	return outbox.NewPublisher(tx, cfg)
}

// NewContextPublisher returns a long-lived publisher that takes the
// transaction from each message's context (outbox.NewContextPublisher).
func NewContextPublisher(cfg PublisherConfig) (*Publisher, error) {
	return outbox.NewContextPublisher(cfg)
}

// DeliverAt makes msg due at t (outbox.DeliverAt).
func DeliverAt(msg *message.Message, t time.Time) { outbox.DeliverAt(msg, t) }

// DeliverAfter makes msg due d from now (outbox.DeliverAfter).
func DeliverAfter(msg *message.Message, d time.Duration) { outbox.DeliverAfter(msg, d) }

// KeyHash places a key in a forwarder partition (outbox.KeyHash).
func KeyHash(key string) int32 { return outbox.KeyHash(key) }

// Limits and fields of the outbox publisher (package forwarder/outbox).
const (
	DefaultKeyMetadataField     = outbox.DefaultKeyMetadataField
	DefaultMaxPayloadBytes      = outbox.DefaultMaxPayloadBytes
	MaxMessageBytesWithoutTable = outbox.MaxMessageBytesWithoutTable
	DelayedUntilMetadataField   = outbox.DelayedUntilMetadataField
	DelayedForMetadataField     = outbox.DelayedForMetadataField
)

// Errors of the forwarder and the outbox publisher.
var (
	// ErrNoTx is returned when Publish finds no transaction: millbox
	// never falls back to autocommit.
	ErrNoTx = sqladapters.ErrNoTx
	// ErrInvalidMessage is returned for a message the outbox cannot store
	// faithfully (destination.ErrInvalidMessage).
	ErrInvalidMessage = destination.ErrInvalidMessage
	// ErrInvalidConfig is returned by constructors for a bad config.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
	// ErrClosed is returned by a closed publisher or forwarder.
	ErrClosed = destination.ErrClosed
	// ErrNotificationsLost is reported while notifications do not arrive
	// (polling.ErrNotificationsLost).
	ErrNotificationsLost = polling.ErrNotificationsLost
)

// The destination contract (package forwarder/destination).
type (
	// PartialError is returned by a batch publisher that delivered a
	// prefix of a call.
	PartialError = destination.PartialError
	// TxDestination publishes a partition's rows in transactions, for
	// Config.ExactlyOnce.
	TxDestination = destination.TxDestination
	// TxBatch is the messages of one ordering key in a transaction.
	TxBatch = destination.TxBatch
	// TxMessage is a message of a TxBatch and its topic.
	TxMessage = destination.TxMessage
	// TxAbortedError is a transaction known not to have committed.
	TxAbortedError = destination.TxAbortedError
)

var (
	// ErrDestinationUnavailable marks a failure of the destination rather
	// than of the messages.
	ErrDestinationUnavailable = destination.ErrDestinationUnavailable
	// ErrFenced marks a transaction of a partition another forwarder
	// claimed since.
	ErrFenced = destination.ErrFenced
)

// DeliveredPrefix returns how many leading messages of a Publish call err
// reports as delivered (destination.DeliveredPrefix).
func DeliveredPrefix(err error, n int) int { return destination.DeliveredPrefix(err, n) }

// DestinationUnavailable marks err as a failure of the destination rather
// than of the messages (destination.DestinationUnavailable).
func DestinationUnavailable(err error) error { return destination.DestinationUnavailable(err) }

// The polling source (package forwarder/polling).
type Polling = polling.Source

// Defaults of Polling.
const (
	DefaultPollInterval        = polling.DefaultPollInterval
	DefaultPartitions          = polling.DefaultPartitions
	DefaultLeaseTTL            = polling.DefaultLeaseTTL
	DefaultWatchInterval       = polling.DefaultWatchInterval
	DefaultNotifyProbeInterval = polling.DefaultNotifyProbeInterval
)

// Telemetry chooses where the forwarder and the publisher report metrics
// and spans, and how trace context travels (telemetry.Config).
type Telemetry = telemetry.Config

// OutboxMetricsOptions configures RegisterOutboxMetrics.
type OutboxMetricsOptions = telemetry.OutboxMetricsOptions

// RegisterOutboxMetrics reports the outbox of d as gauges of mp
// (telemetry.RegisterOutboxMetrics).
func RegisterOutboxMetrics(mp metric.MeterProvider, db sqladapters.Executor, d sqladapters.Dialect, opts OutboxMetricsOptions) (unregister func() error, err error) {
	return telemetry.RegisterOutboxMetrics(mp, db, d, opts)
}

// DefaultPropagator returns the W3C Trace Context propagator
// (telemetry.DefaultPropagator).
func DefaultPropagator() propagation.TextMapPropagator { return telemetry.DefaultPropagator() }

// Metric and attribute names, and error classes (package
// forwarder/telemetry).
const (
	MetricSentMessages               = telemetry.MetricSentMessages
	MetricOperationDuration          = telemetry.MetricOperationDuration
	MetricCommitToAck                = telemetry.MetricCommitToAck
	MetricBatchSize                  = telemetry.MetricBatchSize
	MetricDeadLettered               = telemetry.MetricDeadLettered
	MetricPartitions                 = telemetry.MetricPartitions
	MetricRunning                    = telemetry.MetricRunning
	MetricOutboxPending              = telemetry.MetricOutboxPending
	MetricOutboxOldestPendingAge     = telemetry.MetricOutboxOldestPendingAge
	MetricOutboxDeadLetters          = telemetry.MetricOutboxDeadLetters
	MetricOutboxHeldKeys             = telemetry.MetricOutboxHeldKeys
	MetricOutboxScheduled            = telemetry.MetricOutboxScheduled
	AttrOutboxTable                  = telemetry.AttrOutboxTable
	ErrorClassTimeout                = telemetry.ErrorClassTimeout
	ErrorClassCanceled               = telemetry.ErrorClassCanceled
	ErrorClassInvalidMessage         = telemetry.ErrorClassInvalidMessage
	ErrorClassDestinationUnavailable = telemetry.ErrorClassDestinationUnavailable
	ErrorClassPublish                = telemetry.ErrorClassPublish
	DefaultOutboxMetricsInterval     = telemetry.DefaultOutboxMetricsInterval
	DefaultOutboxMetricsTimeout      = telemetry.DefaultOutboxMetricsTimeout
)
