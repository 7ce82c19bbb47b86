package forwarder

import (
	"cmp"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Config.
const (
	DefaultBatchSize      = 2000
	DefaultConcurrency    = 256
	DefaultPublishBatch   = 100
	DefaultPollInterval   = time.Second
	DefaultPartitions     = 16
	DefaultLeaseTTL       = 15 * time.Second
	DefaultMinBackoff     = time.Second
	DefaultMaxBackoff     = 5 * time.Minute
	DefaultBackoffJitter  = 0.2
	DefaultMaxAttempts    = 10
	DefaultCloseTimeout   = 30 * time.Second
	DefaultPublishTimeout = 30 * time.Second
	DefaultWatchInterval  = 5 * time.Millisecond

	DefaultNotifyProbeInterval = 30 * time.Second
)

// Config configures a Forwarder. Pass it by value; New applies defaults to
// its copy and validates it.
type Config struct {
	// DB is where the outbox lives: pgxv5.WrapPool(pool),
	// stdsql.WrapDB(db) or wmsql.WrapBeginner(b). Required. The
	// forwarder finds new rows by watching the outbox's high-water mark
	// (WatchInterval); when the DB can listen for notifications
	// (pgxv5.WrapPool) and the dialect notifies (postgres.Options.Notify),
	// it wakes up on every commit instead. Behind PgBouncer in transaction
	// pooling, give the listener a connection of its own:
	// pgxv5.WrapPool(pool, pgxv5.ListenOn(directURL)).
	DB sqladapters.DB
	// Dialect describes the database and the outbox table. Required.
	Dialect sqladapters.Dialect
	// Publisher is the destination, any Watermill publisher (Kafka,
	// RabbitMQ, ...). Required. The forwarder does not close it.
	Publisher message.Publisher
	// Topic maps a row's topic to the destination topic. Defaults to
	// the row's own topic. An error counts as a failed attempt.
	Topic func(topic string, msg *message.Message) (string, error)

	// BatchSize is the number of rows read per round. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Concurrency is the number of Publish calls in flight at once. A
	// key's messages are published in order by one call at a time;
	// different keys flow in parallel. Defaults to DefaultConcurrency.
	Concurrency int
	// PublishBatch is the most messages of one key handed to the
	// destination in one Publish call (consecutive messages for one
	// topic). Watermill's Kafka and AMQP publishers send them one by one
	// anyway; a batching publisher (forwarder/kafkabatch) sends them in
	// one round trip. 1 publishes every message on its own. Defaults to
	// DefaultPublishBatch.
	PublishBatch int
	// PollInterval is how often an idle forwarder reads the outbox when
	// nothing told it of new rows; it also finds rows whose retry came
	// due. Where the dialect reports a horizon (Postgres), reads start
	// after the rows already forwarded and one read per PollInterval
	// starts at the first row, so a row that becomes pending below them
	// again (a dead letter requeued by an operator) waits at most this
	// long. Defaults to DefaultPollInterval.
	PollInterval time.Duration
	// WatchInterval is how often an idle forwarder looks at the outbox's
	// high-water mark (the position of its id sequence: one cheap
	// query), reading the outbox only when it moved. This finds new rows
	// within a few milliseconds of their commit without NOTIFY. Unused
	// while notifications arrive (Postgres with Options.Notify and
	// pgxv5.WrapPool). Defaults to DefaultWatchInterval; a negative
	// value turns watching off (the forwarder then reads every
	// PollInterval, or when notified).
	WatchInterval time.Duration
	// NotifyProbeInterval is how often a forwarder that listens for
	// notifications checks that they arrive, by notifying its own channel
	// through DB; it also checks at start. When no notification comes
	// back within two seconds, or the listener fails, it logs an error,
	// reports ErrNotificationsLost (Hooks.OnError, Status), watches the
	// high-water mark as without notifications, and listens again until
	// a probe arrives. Defaults to DefaultNotifyProbeInterval; a negative
	// value turns probing off.
	NotifyProbeInterval time.Duration

	// Partitions splits the outbox by ordering key between forwarder
	// instances: each partition is leased by one instance at a time.
	// Every instance of one outbox must use the same value. Defaults to
	// DefaultPartitions.
	Partitions int
	// LeaseTTL is how long a partition lease lasts without renewal. A
	// crashed instance's partitions move to others after it. Renewal
	// happens every LeaseTTL/3. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// InstanceID names this instance in the lease table. Defaults to
	// hostname-pid-random.
	InstanceID string

	// MinBackoff and MaxBackoff bound the exponential delay before a
	// failed row is tried again. Default to DefaultMinBackoff and
	// DefaultMaxBackoff.
	MinBackoff, MaxBackoff time.Duration
	// BackoffJitter randomizes each delay by ± this fraction. Defaults to
	// DefaultBackoffJitter; a negative value disables jitter.
	BackoffJitter float64
	// MaxAttempts moves a row to the dead letters after this many failed
	// attempts. Defaults to DefaultMaxAttempts; a negative value retries
	// forever.
	MaxAttempts int
	// KeepForwarded keeps published rows, stamped with published_at, for
	// audit, instead of deleting them. Defaults to false.
	KeepForwarded bool
	// PublishTimeout bounds one Publish call of the destination. A call
	// that has not returned by then counts as a failed attempt of its
	// first message (with backoff), and the key stays held until the call
	// really returns: a late success can only produce a duplicate, never
	// let a later message of the key overtake. Other keys keep flowing.
	// Defaults to DefaultPublishTimeout.
	PublishTimeout time.Duration
	// CloseTimeout bounds Close. Defaults to DefaultCloseTimeout.
	CloseTimeout time.Duration

	// Logger receives the forwarder's logs. Defaults to the log/slog
	// default logger, with Watermill's info level mapped to slog's debug
	// level, so that errors and warnings show and routine retries do not.
	Logger watermill.LoggerAdapter
	// Telemetry sets the OpenTelemetry providers for the forwarder's
	// metrics and send spans. Zero value: the global providers, which do
	// nothing until the application installs an SDK.
	Telemetry Telemetry
	// Hooks receive events as they happen. All optional.
	Hooks Hooks
}

// Hooks are called from the forwarder's goroutines; they must be fast and
// safe for concurrent use.
type Hooks struct {
	// OnBatch is called after each Publish call of the destination with
	// its outcome. Published rows are deleted in the background: right
	// after OnBatch they may still be in the table (OutboxBacklog counts
	// them as pending).
	OnBatch func(BatchStats)
	// OnFailure is called for every failed attempt.
	OnFailure func(FailedAttempt)
	// OnError is called when the forwarder meets an error it retries: a
	// read of the outbox, recording a failed attempt, deleting published
	// rows, renewing leases, table maintenance, the destination becoming
	// unavailable, a Publish call passing PublishTimeout, notifications
	// not arriving (ErrNotificationsLost).
	OnError func(error)
	// OnRead is called after each read of the outbox with the number of
	// rows it returned.
	OnRead func(rows int)
}

// FailedAttempt is one failed attempt to publish an outbox row, as
// Hooks.OnFailure reports it.
type FailedAttempt struct {
	// ID is the row's outbox id; UUID, Topic and Key are its message's
	// (Key is empty for a message without an ordering key).
	ID               int64
	UUID, Topic, Key string
	// Attempts counts the row's failed attempts, this one included.
	Attempts int
	// Error is the error as stored in the row's last_error.
	Error string
	// Backoff is the delay before the row is tried again.
	Backoff time.Duration
	// Dead tells that the row moved to the dead letters.
	Dead bool
}

// BatchStats describes one Publish call of the destination: the messages
// handed to it, those it delivered, those it failed (zero when the call
// succeeded), and how long it took. Dead letters are reported through
// Hooks.OnFailure (FailedAttempt.Dead).
type BatchStats struct {
	Messages, Forwarded, Failed int
	Duration                    time.Duration
}

func (c *Config) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.PublishBatch = cmp.Or(c.PublishBatch, DefaultPublishBatch)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.WatchInterval = cmp.Or(c.WatchInterval, DefaultWatchInterval)
	c.NotifyProbeInterval = cmp.Or(c.NotifyProbeInterval, DefaultNotifyProbeInterval)
	c.Partitions = cmp.Or(c.Partitions, DefaultPartitions)
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), watermill.NewShortUUID())
	}
	c.MinBackoff = cmp.Or(c.MinBackoff, DefaultMinBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.BackoffJitter = cmp.Or(c.BackoffJitter, DefaultBackoffJitter)
	if c.BackoffJitter < 0 {
		c.BackoffJitter = 0
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, DefaultCloseTimeout)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	if c.Logger == nil {
		c.Logger = defaultLogger()
	}
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first, as in New.
func (c Config) Validate() error {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.DB == nil:
		return bad("Config.DB is required (pgxv5.WrapPool, stdsql.WrapDB or wmsql.WrapBeginner)")
	case c.Dialect == nil:
		return bad("Config.Dialect is required")
	case c.Publisher == nil:
		return bad("Config.Publisher (the destination) is required")
	case c.BatchSize < 1 || c.BatchSize > 50000:
		return bad("Config.BatchSize must be between 1 and 50000, got %d", c.BatchSize)
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return bad("Config.Concurrency must be between 1 and 4096, got %d", c.Concurrency)
	case c.PublishBatch < 1 || c.PublishBatch > 10000:
		return bad("Config.PublishBatch must be between 1 and 10000, got %d", c.PublishBatch)
	case c.PollInterval < time.Millisecond:
		return bad("Config.PollInterval must be at least 1ms, got %v", c.PollInterval)
	case c.WatchInterval > 0 && c.WatchInterval < time.Millisecond:
		return bad("Config.WatchInterval must be at least 1ms (or negative to turn watching off), got %v", c.WatchInterval)
	case c.NotifyProbeInterval > 0 && c.NotifyProbeInterval < 10*time.Millisecond:
		return bad("Config.NotifyProbeInterval must be at least 10ms (or negative to turn probing off), got %v", c.NotifyProbeInterval)
	case c.Partitions < 1 || c.Partitions > 4096:
		return bad("Config.Partitions must be between 1 and 4096, got %d", c.Partitions)
	case c.LeaseTTL < 300*time.Millisecond:
		return bad("Config.LeaseTTL must be at least 300ms, got %v", c.LeaseTTL)
	case len(c.InstanceID) > 200:
		return bad("Config.InstanceID must be at most 200 bytes")
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return bad("Config.MinBackoff (%v) must be >= 0 and <= MaxBackoff (%v)", c.MinBackoff, c.MaxBackoff)
	case c.BackoffJitter > 1:
		return bad("Config.BackoffJitter must be at most 1, got %v", c.BackoffJitter)
	case c.CloseTimeout < 0:
		return bad("Config.CloseTimeout must not be negative")
	case c.PublishTimeout < 0:
		return bad("Config.PublishTimeout must not be negative")
	}
	return nil
}

// defaultLogger logs errors to the log/slog default logger; Watermill's
// info level becomes slog's debug level.
func defaultLogger() watermill.LoggerAdapter {
	return watermill.NewSlogLoggerWithLevelMapping(nil, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
}
