package forwarder

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Config.
const (
	DefaultBatchSize           = 2000
	DefaultConcurrency         = 256
	DefaultPublishBatch        = 100
	DefaultDelayedPollInterval = time.Second
	DefaultMaxAttempts         = 10
	DefaultCloseTimeout        = 30 * time.Second
	DefaultPublishTimeout      = 30 * time.Second
)

// Defaults of ExponentialRetry, the default RetryPolicy.
const (
	DefaultMinBackoff    = time.Second
	DefaultMaxBackoff    = 5 * time.Minute
	DefaultBackoffJitter = 0.2
)

// Source is where a Forwarder finds the rows to forward: Polling, or
// cdc.Source for PostgreSQL's logical replication. Its methods are the
// forwarder's: Source is implemented by millbox's packages only.
type Source interface {
	// Validate names the first invalid field of the source's settings.
	Validate() error
	// Open returns the source a forwarder drives. New calls it.
	Open(env source.Env) (source.Source, error)
}

// Config configures a Forwarder. Pass it by value; New applies defaults to
// its copy and validates it.
type Config struct {
	// DB is where the outbox lives: pgxv5.WrapPool(pool),
	// stdsql.WrapDB(db) or wmsql.WrapBeginner(b). Required.
	DB sqladapters.DB
	// Dialect describes the database and the outbox table. Required.
	Dialect sqladapters.Dialect
	// Destination is where messages go: any Watermill publisher (Kafka,
	// RabbitMQ, NATS, ...), or a batching one such as
	// forwarder/kafkabatch. Required. The forwarder does not close it.
	Destination message.Publisher
	// Topic maps a row's topic to the destination topic. Defaults to
	// the row's own topic. An error counts as a failed attempt.
	Topic func(topic string, msg *message.Message) (string, error)
	// ExactlyOnce publishes every row exactly once, for readers of
	// committed data: the rows of each partition of the outbox go to the
	// destination in transactions that carry the forwarder's progress and
	// are fenced by the partition's holder (see the package doc). The
	// Destination must implement destination.TxDestination
	// (kafkabatch.TxPublisher does); New refuses one that does not. Defaults to false: at least
	// once.
	ExactlyOnce bool
	// Source is where the forwarder finds the rows to forward: Polling,
	// which reads the outbox table (every database), or cdc.Source, which
	// streams its inserts through PostgreSQL's logical replication.
	// Defaults to Polling{} with its defaults.
	Source Source

	// BatchSize is the most rows one read of the outbox returns, and the
	// most rows the forwarder holds queued in memory before it reads (or
	// takes from a stream) more. Defaults to DefaultBatchSize.
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
	// DelayedPollInterval is how often each instance looks for delayed
	// messages that came due, to move them into the outbox; it also moves
	// them at the due times that publishers in its own process report.
	// Defaults to DefaultDelayedPollInterval.
	DelayedPollInterval time.Duration

	// Retry decides how long a row whose publish failed waits before it
	// is tried again. Defaults to ExponentialRetry{} (1 s doubling up to
	// 5 minutes, ± 20%).
	Retry RetryPolicy
	// MaxAttempts moves a row to the dead letters after this many failed
	// attempts. Defaults to DefaultMaxAttempts; a negative value retries
	// forever.
	MaxAttempts int
	// DeadLetterHoldsKey makes a dead letter hold its ordering key: the
	// key's later messages wait in the outbox until the dead letter is
	// requeued, and then go after it, in order, or discarded, and then go
	// on. So a key's consumers see 1, 2, 3, 4, never 1, 3, 4 and then 2.
	// Other keys keep flowing; messages without a key hold nothing. The
	// hold is stored with the dead letter (the dead letters' holds
	// column), so every instance, a restarted one, the millbox command
	// and the admin page see it; every instance of one outbox must use
	// the same value. It needs the schema of migration 6. Defaults to
	// false: a dead letter's key goes on with its next message.
	DeadLetterHoldsKey bool
	// KeepForwarded moves published rows to the table of forwarded rows
	// kept for audit (the outbox's name with _kept, with the time they
	// were published), instead of deleting them; ops.Prune deletes them
	// later. Defaults to false.
	KeepForwarded bool
	// PublishTimeout bounds one call of the destination: a Publish call,
	// or with ExactlyOnce a transaction (TxDestination.PublishTx). The
	// forwarder sets it as the deadline of the call's context (the
	// messages' context, or PublishTx's), so a destination derives its own
	// timeouts from it (kafkabatch, amqpbatch and redisbatch do) and
	// returns its own error then. A call that has not returned shortly
	// after (a tenth of PublishTimeout, between 50 ms and 1 s) counts as
	// failed: a Publish call as a failed attempt of its first message
	// (with backoff), a transaction as one whose outcome is unknown (its
	// partition is claimed again). Its keys stay held until the call
	// really returns: a late success can only produce a duplicate, never
	// let a later message of the key overtake. Other keys keep flowing.
	// Defaults to DefaultPublishTimeout.
	PublishTimeout time.Duration
	// CloseTimeout bounds Close: the calls in flight, the deletes of
	// published rows and handing the source over (leases, the replication
	// slot) all finish within it. Defaults to DefaultCloseTimeout.
	CloseTimeout time.Duration

	// Wake, when set, makes the forwarder look at the outbox and at its
	// scheduled messages at once whenever it receives a value: for an
	// application that learns of new rows in a way the forwarder does not
	// (a doorbell of its own, as forwarder/fleet has). Defaults to nil.
	Wake <-chan struct{}

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
	// its outcome; with ExactlyOnce, after each transaction (Forwarded
	// counts the messages it committed). Published rows are deleted in the
	// background: right after OnBatch they may still be in the table
	// (Dialect.OutboxStats counts them as pending).
	OnBatch func(BatchStats)
	// OnFailure is called for every failed attempt.
	OnFailure func(FailedAttempt)
	// OnError is called when the forwarder meets an error it retries: a
	// read of the outbox, recording a failed attempt, deleting published
	// rows, renewing leases, table maintenance, the destination becoming
	// unavailable, a Publish call passing PublishTimeout, notifications
	// not arriving (ErrNotificationsLost).
	OnError func(error)
	// OnRead is called after each read of the outbox table with the
	// number of rows it returned.
	OnRead func(rows int)
	// OnActive is called with true when this instance starts publishing
	// (with Polling: it came to hold partitions; with cdc.Source: it
	// became the slot's active reader) and with false when it stops.
	OnActive func(active bool)
}

// RetryPolicy decides when a row whose publish failed is tried again.
// The forwarder asks it once per failed attempt; a row that failed
// MaxAttempts times goes to the dead letters instead. Implementations
// must be safe for concurrent use.
type RetryPolicy interface {
	// NextRetry returns the delay before the next attempt, after attempt
	// (1 for the first) failed with err.
	NextRetry(attempt int, err error) time.Duration
}

// ExponentialRetry is the default RetryPolicy: Min after the first
// failure, doubling with each further one up to Max, each delay
// randomized by ± Jitter. Zero fields take DefaultMinBackoff,
// DefaultMaxBackoff and DefaultBackoffJitter; a negative Jitter turns
// jitter off.
type ExponentialRetry struct {
	Min, Max time.Duration
	Jitter   float64
}

// NextRetry implements RetryPolicy.
func (r ExponentialRetry) NextRetry(attempt int, err error) time.Duration {
	return r.policy().NextRetry(attempt, err)
}

func (r ExponentialRetry) policy() retry.Exponential {
	p := retry.Exponential{
		Min:    cmp.Or(r.Min, DefaultMinBackoff),
		Max:    cmp.Or(r.Max, DefaultMaxBackoff),
		Jitter: cmp.Or(r.Jitter, DefaultBackoffJitter),
	}
	p.Jitter = max(p.Jitter, 0)
	return p
}

// validate names the first invalid field.
func (r ExponentialRetry) validate() error {
	p := r.policy()
	switch {
	case r.Min < 0 || p.Max < p.Min:
		return fmt.Errorf("ExponentialRetry.Min (%v) must be >= 0 and <= Max (%v)", p.Min, p.Max)
	case r.Jitter > 1:
		return fmt.Errorf("ExponentialRetry.Jitter must be at most 1, got %v", r.Jitter)
	}
	return nil
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
	c.DelayedPollInterval = cmp.Or(c.DelayedPollInterval, DefaultDelayedPollInterval)
	if c.Retry == nil {
		c.Retry = ExponentialRetry{}
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, DefaultCloseTimeout)
	c.PublishTimeout = cmp.Or(c.PublishTimeout, DefaultPublishTimeout)
	if c.Logger == nil {
		c.Logger = defaultLogger()
	}
	if c.Source == nil {
		c.Source = Polling{}
	}
}

// Validate names the first invalid field and the rule it breaks, the
// Source's fields included. Zero fields take their defaults first, as in
// New.
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
	case c.Destination == nil:
		return bad("Config.Destination (the publisher messages go to) is required")
	case c.ExactlyOnce && !isTx(c.Destination):
		return bad("Config.ExactlyOnce needs a Destination that publishes in transactions (a destination.TxDestination, such as kafkabatch.TxPublisher); %T is not one", c.Destination)
	case c.BatchSize < 1 || c.BatchSize > 50000:
		return bad("Config.BatchSize must be between 1 and 50000, got %d", c.BatchSize)
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return bad("Config.Concurrency must be between 1 and 4096, got %d", c.Concurrency)
	case c.PublishBatch < 1 || c.PublishBatch > 10000:
		return bad("Config.PublishBatch must be between 1 and 10000, got %d", c.PublishBatch)
	case c.DelayedPollInterval < time.Millisecond:
		return bad("Config.DelayedPollInterval must be at least 1ms, got %v", c.DelayedPollInterval)
	case c.CloseTimeout < 0:
		return bad("Config.CloseTimeout must not be negative")
	case c.PublishTimeout < 0:
		return bad("Config.PublishTimeout must not be negative")
	}
	if r, ok := c.Retry.(ExponentialRetry); ok {
		if err := r.validate(); err != nil {
			return bad("Config.Retry: %v", err)
		}
	}
	return c.Source.Validate()
}

// defaultLogger logs errors to the log/slog default logger; Watermill's
// info level becomes slog's debug level.
func defaultLogger() watermill.LoggerAdapter {
	return watermill.NewSlogLoggerWithLevelMapping(nil, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
}

func isTx(p message.Publisher) bool {
	_, ok := p.(destination.TxDestination)
	return ok
}
