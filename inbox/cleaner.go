package inbox

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/startstop"
)

const (
	// DefaultRetention is how long inbox rows are kept: twice Kafka's
	// default topic retention and consumer-offset retention (7 days). See
	// the package documentation for how to choose it.
	DefaultRetention = 14 * 24 * time.Hour
	// MinRetention is the shortest retention accepted. A shorter window
	// would forget messages the broker is still redelivering.
	MinRetention = time.Minute
	// DefaultBatchSize is the number of rows one delete statement removes.
	DefaultBatchSize = 1000
	// DefaultInterval is the pause between two cleaning rounds of Run.
	DefaultInterval = 5 * time.Minute
	// DefaultCloseTimeout is how long Close lets a running batch finish
	// before cancelling it.
	DefaultCloseTimeout = 30 * time.Second
)

var (
	// ErrClosed is returned by Run after Close.
	ErrClosed = sqladapters.ErrClosed
	// ErrRunning is returned by Run while another Run of the same Cleaner
	// is going on.
	ErrRunning = startstop.ErrRunning
)

// CleanerConfig configures a Cleaner.
type CleanerConfig struct {
	// DB runs the deletes, each batch in its own statement. Required.
	DB sqladapters.DB
	// Dialect describes the database and the inbox table. Required.
	Dialect sqladapters.Dialect
	// Retention is how long a row is kept after it was recorded. A
	// duplicate arriving later than this is processed again. Defaults to
	// DefaultRetention; at least MinRetention.
	Retention time.Duration
	// BatchSize is the most rows one statement deletes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// Interval is the pause between cleaning rounds of Run. Defaults to
	// DefaultInterval.
	Interval time.Duration
	// CloseTimeout bounds how long Close waits for a running batch before
	// cancelling it. Defaults to DefaultCloseTimeout.
	CloseTimeout time.Duration
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *CleanerConfig) setDefaults() {
	c.Retention = cmp.Or(c.Retention, DefaultRetention)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, DefaultCloseTimeout)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate names the first invalid field. Zero fields take their defaults
// first, as in NewCleaner.
func (c CleanerConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.DB == nil:
		return fmt.Errorf("%w: inbox.CleanerConfig.DB is required (for example pgxv5.WrapPool(pool))", ErrInvalidConfig)
	case c.Dialect == nil:
		return fmt.Errorf("%w: inbox.CleanerConfig.Dialect is required (for example postgres.New(postgres.Options{}))", ErrInvalidConfig)
	case c.Retention < MinRetention:
		return fmt.Errorf("%w: inbox.CleanerConfig.Retention %v is shorter than MinRetention %v", ErrInvalidConfig, c.Retention, MinRetention)
	case c.BatchSize < 1:
		return fmt.Errorf("%w: inbox.CleanerConfig.BatchSize %d must be at least 1", ErrInvalidConfig, c.BatchSize)
	case c.Interval <= 0:
		return fmt.Errorf("%w: inbox.CleanerConfig.Interval %v must be positive", ErrInvalidConfig, c.Interval)
	case c.CloseTimeout <= 0:
		return fmt.Errorf("%w: inbox.CleanerConfig.CloseTimeout %v must be positive", ErrInvalidConfig, c.CloseTimeout)
	}
	return nil
}

// Cleaner deletes inbox rows older than the retention window. Call
// CleanOnce from your own scheduler, or Run to clean every Interval.
type Cleaner struct {
	cfg       CleanerConfig
	life      startstop.Base
	cancelled atomic.Bool // Close cancelled a batch in flight
}

// NewCleaner validates cfg and returns a Cleaner. It starts nothing: call
// Run.
func NewCleaner(cfg CleanerConfig) (*Cleaner, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Cleaner{cfg: cfg}, nil
}

// CleanOnce deletes every row older than the retention window, BatchSize
// rows per statement, each statement on its own, and returns how many it
// deleted. The window is measured with this process's clock against the
// database's received_at; keep clocks in sync to well within the window.
// It stops early when ctx ends.
func (c *Cleaner) CleanOnce(ctx context.Context) (deleted int, err error) {
	return c.clean(ctx, nil)
}

func (c *Cleaner) clean(ctx context.Context, stop <-chan struct{}) (int, error) {
	cutoff := time.Now().Add(-c.cfg.Retention)
	// Each batch starts where the last one ended, so that it does not
	// walk the index entries of the rows deleted before it. A row
	// recorded by a transaction that began before that point and
	// committed after the batch passed it is left to the next round.
	var from time.Time
	deleted := 0
	for {
		n, next, err := c.cfg.Dialect.DeleteInbox(ctx, c.cfg.DB, from, cutoff, c.cfg.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("millbox: inbox: delete rows older than %v: %w", c.cfg.Retention, err)
		}
		from = next
		deleted += int(n)
		if n < int64(c.cfg.BatchSize) {
			return deleted, nil
		}
		select {
		case <-stop:
			return deleted, nil
		case <-ctx.Done():
			return deleted, ctx.Err()
		default:
		}
	}
}

// Run cleans right away and then every Interval until ctx ends or Close is
// called; it then returns nil. A failed round is logged and retried at the
// next interval. Run blocks; it may be called once.
func (c *Cleaner) Run(ctx context.Context) error {
	ctx, err := c.life.Begin(ctx)
	if err != nil {
		return err
	}
	return c.life.End(c.run(ctx))
}

func (c *Cleaner) run(ctx context.Context) error {
	c.life.Started()
	// A batch in flight when Close is called may finish, for up to
	// CloseTimeout: it runs on a context that Close's cancel reaches only
	// that much later.
	batchCtx, cancelBatch := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelBatch()
	stop := context.AfterFunc(ctx, func() {
		time.AfterFunc(c.cfg.CloseTimeout, func() {
			if batchCtx.Err() == nil {
				c.cancelled.Store(true)
				cancelBatch()
			}
		})
	})
	defer stop()

	log := c.cfg.Logger.With(watermill.LogFields{"inbox_table": c.cfg.Dialect.InboxTable()})
	log.Info("Inbox cleaner started", watermill.LogFields{"retention": c.cfg.Retention, "interval": c.cfg.Interval})
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		n, err := c.clean(batchCtx, ctx.Done())
		switch {
		case err != nil && batchCtx.Err() != nil:
			return nil
		case err != nil:
			log.Error("Inbox cleaning failed", err, watermill.LogFields{"deleted": n})
		case n > 0:
			log.Debug("Inbox cleaned", watermill.LogFields{"deleted": n})
		}
		timer.Reset(c.cfg.Interval)
	}
}

// Running is closed once Run has started, or has returned.
func (c *Cleaner) Running() <-chan struct{} { return c.life.Running() }

// Ready waits until Run runs and returns nil, or returns why it will not:
// the error Run returned, ErrClosed, or ctx's error.
func (c *Cleaner) Ready(ctx context.Context) error { return c.life.Ready(ctx) }

// Close stops Run: it lets the batch in flight finish for up to
// CloseTimeout, then cancels it, and returns once Run has returned. Close
// is idempotent; a Cleaner that never ran closes at once.
func (c *Cleaner) Close() error {
	if err := c.life.Close(c.cfg.CloseTimeout+time.Second, "inbox cleaner"); err != nil || c.cancelled.Load() {
		return fmt.Errorf("millbox: inbox cleaner: the batch in flight did not finish within CloseTimeout %v and was cancelled", c.cfg.CloseTimeout)
	}
	return nil
}
