package cdc

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Config.
const (
	DefaultSlot           = "millbox_cdc"
	DefaultPublication    = "millbox_cdc"
	DefaultConcurrency    = 256
	DefaultPublishBatch   = 100
	DefaultPollInterval   = 500 * time.Millisecond
	DefaultStandbyRetry   = time.Second
	DefaultStatusInterval = time.Second
	DefaultMaxInflight    = 20000
	DefaultDeleteBatch    = 1000
	DefaultMinBackoff     = time.Second
	DefaultMaxBackoff     = 5 * time.Minute
	DefaultBackoffJitter  = 0.2
	DefaultMaxAttempts    = 10
	DefaultCloseTimeout   = 30 * time.Second
	DefaultPublishTimeout = 30 * time.Second
)

// ErrInvalidConfig is sqladapters.ErrInvalidConfig, returned for a bad
// Config; the error names the field and the rule.
var ErrInvalidConfig = sqladapters.ErrInvalidConfig

// Config configures a Forwarder. Pass it by value; New applies defaults to
// its copy and validates it.
type Config struct {
	// ConnString is the PostgreSQL connection string (URL or key=value)
	// of the database holding the outbox. The forwarder opens its
	// replication connection with it (adding replication=database), so
	// its role needs the REPLICATION attribute. Required.
	ConnString string
	// DB is the same database for ordinary statements: reading rows of
	// keys handed to polling, recording failures, deleting published rows.
	// pgxv5.WrapPool(pool) or stdsql.WrapDB(db). Required.
	DB sqladapters.DB
	// Dialect describes the outbox table; it must be a postgres dialect.
	// Required.
	Dialect sqladapters.Dialect
	// Publisher is the destination, any Watermill publisher. Required. The
	// forwarder does not close it.
	Publisher message.Publisher
	// Topic maps a row's topic to the destination topic. Defaults to the
	// row's own topic. An error counts as a failed attempt.
	Topic func(topic string, msg *message.Message) (string, error)

	// Slot is the logical replication slot the forwarder reads. Slot names
	// are global to the PostgreSQL cluster: give every outbox its own.
	// Defaults to DefaultSlot.
	Slot string
	// Publication is the publication of the outbox table the slot
	// decodes. Defaults to DefaultPublication.
	Publication string
	// CreateIfMissing makes Run create the publication and the slot (as
	// Setup does) when they do not exist. Defaults to false: Run reports
	// them missing.
	CreateIfMissing bool

	// Concurrency is the number of Publish calls in flight at once. A
	// key's messages are published in order by one call at a time;
	// different keys flow in parallel. Defaults to DefaultConcurrency.
	Concurrency int
	// PublishBatch is the most messages of one key handed to the
	// destination in one Publish call. Defaults to DefaultPublishBatch.
	PublishBatch int
	// PollInterval is how often the rows of keys handed to polling are
	// read while such keys exist and nothing else calls for a read (a new
	// handed key, rows just published, a retry coming due). Defaults to
	// DefaultPollInterval.
	PollInterval time.Duration
	// StandbyRetry is how often a standby instance tries to become the
	// active reader. Defaults to DefaultStandbyRetry.
	StandbyRetry time.Duration
	// StatusInterval is how often the confirmed position is reported to
	// the server. Defaults to DefaultStatusInterval.
	StatusInterval time.Duration
	// MaxInflight bounds the rows held in memory (queued, being published
	// or waiting for their delete); the stream is not read further until
	// some complete. Defaults to DefaultMaxInflight.
	MaxInflight int
	// DeleteBatch is the most published rows deleted (or stamped, with
	// KeepForwarded) by one statement. Defaults to DefaultDeleteBatch.
	DeleteBatch int

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
	// KeepForwarded stamps published rows with published_at instead of
	// deleting them. Defaults to false.
	KeepForwarded bool
	// PublishTimeout bounds one Publish call of the destination. A call
	// that has not returned by then counts as a failed attempt of its first
	// row and frees its Concurrency slot; its key goes to the polling path
	// and stays held until the call really returns, so a late success can
	// only produce a duplicate, never let a later row of the key overtake.
	// Defaults to DefaultPublishTimeout.
	PublishTimeout time.Duration
	// CloseTimeout bounds Close and the hand-over when the active reader
	// stops. Defaults to DefaultCloseTimeout.
	CloseTimeout time.Duration

	// Logger receives the forwarder's logs. Defaults to the log/slog
	// default logger, Watermill's info level mapped to slog's debug level.
	Logger watermill.LoggerAdapter
	// Telemetry sets where the slot gauges are reported.
	Telemetry Telemetry
	// Hooks receive events as they happen. All optional.
	Hooks Hooks
}

// Telemetry chooses where the forwarder reports its gauges.
type Telemetry struct {
	// MeterProvider receives MetricSlotLag and MetricSlotAge. Defaults to
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Hooks are called from the forwarder's goroutines; they must be fast and
// safe for concurrent use.
type Hooks struct {
	// OnFailure is called for every failed attempt of a row.
	OnFailure func(forwarder.FailedAttempt)
	// OnError is called for every error the forwarder retries: a lost
	// replication connection, a failed read, delete or failure record.
	OnError func(error)
	// OnActive is called with true when this instance becomes the active
	// reader and with false when it stops being it.
	OnActive func(active bool)
}

func (c *Config) setDefaults() {
	c.Slot = cmp.Or(c.Slot, DefaultSlot)
	c.Publication = cmp.Or(c.Publication, DefaultPublication)
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.PublishBatch = cmp.Or(c.PublishBatch, DefaultPublishBatch)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.StandbyRetry = cmp.Or(c.StandbyRetry, DefaultStandbyRetry)
	c.StatusInterval = cmp.Or(c.StatusInterval, DefaultStatusInterval)
	c.MaxInflight = cmp.Or(c.MaxInflight, DefaultMaxInflight)
	c.DeleteBatch = cmp.Or(c.DeleteBatch, DefaultDeleteBatch)
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
		c.Logger = watermill.NewSlogLoggerWithLevelMapping(nil, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	}
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first, as in New.
func (c Config) Validate() error {
	c.setDefaults()
	if c.Publisher == nil {
		return fmt.Errorf("%w: Config.Publisher (the destination) is required", ErrInvalidConfig)
	}
	return c.validateDB()
}

// validateDB validates what Setup and Drop need: all but the publisher.
func (c Config) validateDB() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.ConnString == "":
		return bad("Config.ConnString is required (the replication connection)")
	case c.DB == nil:
		return bad("Config.DB is required (pgxv5.WrapPool or stdsql.WrapDB)")
	case c.Dialect == nil:
		return bad("Config.Dialect is required")
	case c.Dialect.Name() != "postgres":
		return bad("Config.Dialect must be a postgres dialect, got %q: change data capture reads PostgreSQL's logical replication", c.Dialect.Name())
	}
	if err := sqladapters.ValidateIdentifier("Config.Slot", c.Slot); err != nil {
		return bad("%v", err)
	}
	if err := sqladapters.ValidateIdentifier("Config.Publication", c.Publication); err != nil {
		return bad("%v", err)
	}
	switch {
	case !slotNameRe.MatchString(c.Slot):
		return bad("Config.Slot %q may contain only lower case letters, digits and underscores (PostgreSQL's rule for slot names)", c.Slot)
	case c.Concurrency < 1 || c.Concurrency > 4096:
		return bad("Config.Concurrency must be between 1 and 4096, got %d", c.Concurrency)
	case c.PublishBatch < 1 || c.PublishBatch > 10000:
		return bad("Config.PublishBatch must be between 1 and 10000, got %d", c.PublishBatch)
	case c.PollInterval < time.Millisecond:
		return bad("Config.PollInterval must be at least 1ms, got %v", c.PollInterval)
	case c.StandbyRetry < 10*time.Millisecond:
		return bad("Config.StandbyRetry must be at least 10ms, got %v", c.StandbyRetry)
	case c.StatusInterval < 10*time.Millisecond || c.StatusInterval > 30*time.Second:
		return bad("Config.StatusInterval must be between 10ms and 30s (below the server's wal_sender_timeout), got %v", c.StatusInterval)
	case c.MaxInflight < 1:
		return bad("Config.MaxInflight must be at least 1, got %d", c.MaxInflight)
	case c.DeleteBatch < 1 || c.DeleteBatch > 50000:
		return bad("Config.DeleteBatch must be between 1 and 50000, got %d", c.DeleteBatch)
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return bad("Config.MinBackoff (%v) must be >= 0 and <= MaxBackoff (%v)", c.MinBackoff, c.MaxBackoff)
	case c.BackoffJitter > 1:
		return bad("Config.BackoffJitter must be at most 1, got %v", c.BackoffJitter)
	case c.CloseTimeout < 0:
		return bad("Config.CloseTimeout must not be negative")
	case c.PublishTimeout < time.Millisecond:
		return bad("Config.PublishTimeout must be at least 1ms, got %v", c.PublishTimeout)
	}
	return nil
}
