package forwarder

import (
	"cmp"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Config.
const (
	DefaultBatchSize     = 2000
	DefaultConcurrency   = 256
	DefaultPublishBatch  = 100
	DefaultPollInterval  = time.Second
	DefaultPartitions    = 16
	DefaultLeaseTTL      = 15 * time.Second
	DefaultMinBackoff    = time.Second
	DefaultMaxBackoff    = 5 * time.Minute
	DefaultBackoffJitter = 0.2
	DefaultMaxAttempts   = 10
	DefaultCloseTimeout  = 30 * time.Second
)

// Config configures a Forwarder. Pass it by value; New applies defaults to
// its copy and validates it.
type Config struct {
	// DB is where the outbox lives: pgxv5.WrapPool(pool),
	// stdsql.WrapDB(db) or wmsql.WrapBeginner(b). Required. When it can
	// listen for notifications (pgxv5.WrapPool) and the dialect notifies,
	// the forwarder wakes up on every commit; otherwise it polls.
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
	// PollInterval is how often an idle forwarder looks for rows when no
	// notification arrives. Defaults to DefaultPollInterval.
	PollInterval time.Duration

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
	// CloseTimeout bounds Close. Defaults to DefaultCloseTimeout.
	CloseTimeout time.Duration

	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Hooks receive metrics events. All optional.
	Hooks Hooks
}

// Hooks are called from the forwarder's goroutines; they must be fast and
// safe for concurrent use.
type Hooks struct {
	// OnBatch is called after each round with the rows read, published,
	// failed and dead-lettered, and the round's duration. Published rows
	// are deleted in the background: right after OnBatch they may still be
	// in the table (OutboxBacklog counts them as pending).
	OnBatch func(BatchStats)
	// OnFailure is called for every failed attempt.
	OnFailure func(f sqladapters.Failure, row sqladapters.OutboxRow)
}

// BatchStats describes one round of the forwarder.
type BatchStats struct {
	Read, Forwarded, Failed, DeadLettered, Skipped int
	Duration                                       time.Duration
}

func (c *Config) setDefaults() {
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.PublishBatch = cmp.Or(c.PublishBatch, DefaultPublishBatch)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
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
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate names the first invalid field and the rule it breaks.
func (c Config) Validate() error {
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
	}
	return nil
}
