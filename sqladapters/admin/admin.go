package admin

import (
	"cmp"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Defaults applied by New.
const (
	// DefaultTitle heads the page.
	DefaultTitle = "millbox"
	// DefaultGroupLimit is the most error groups the overview lists.
	DefaultGroupLimit = 50
	// DefaultPageSize is the most dead letters one list page shows.
	DefaultPageSize = 50
	// DefaultTimeout bounds the database work of one request.
	DefaultTimeout = 15 * time.Second
	// DefaultMaxPayloadBytes is how much of a payload a message page shows.
	DefaultMaxPayloadBytes = 64 << 10
)

// ErrInvalidConfig is returned by New for a bad Config; the error names
// the field and the rule.
var ErrInvalidConfig = sqladapters.ErrInvalidConfig

// Config configures the handler New returns. Pass it by value; New
// applies defaults to its copy and validates it.
type Config struct {
	// DB holds the millbox tables: pgxv5.WrapPool(pool),
	// stdsql.WrapDB(db) or wmsql.WrapBeginner(b), as given to the
	// forwarder. Required. The page runs single statements, no
	// transactions.
	DB sqladapters.Executor
	// Dialect names the database and the tables, as given to the
	// forwarder. Required; the dialects of sqladapters/postgres,
	// sqladapters/mysql and sqladapters/sqlite all qualify.
	Dialect sqladapters.Dialect

	// Authorize reports whether the request may change anything
	// (requeue or discard dead letters). It is called on every request:
	// on pages to decide whether to show the buttons, on changes to
	// allow or refuse them (403). It must be safe for concurrent use.
	// Defaults to nil: the page is read-only.
	Authorize func(r *http.Request) bool
	// TrustedOrigins are origins, such as "https://ops.example.com",
	// allowed to send changes although they differ from the request's
	// Host, for a reverse proxy that rewrites it. Defaults to none.
	TrustedOrigins []string

	// Title heads the page, to tell installations apart. Defaults to
	// DefaultTitle.
	Title string
	// GroupLimit is the most error groups the overview lists. Defaults
	// to DefaultGroupLimit.
	GroupLimit int
	// PageSize is the most dead letters one list page shows. Defaults to
	// DefaultPageSize.
	PageSize int
	// MaxPayloadBytes is how much of a payload a message page shows.
	// Defaults to DefaultMaxPayloadBytes.
	MaxPayloadBytes int
	// Timeout bounds the database work of one request. A requeue or
	// discard of a group too large for it stops after the batches done
	// so far and reports the error; submitting it again continues.
	// Defaults to DefaultTimeout.
	Timeout time.Duration
	// Logger receives database errors and refused changes. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	c.Title = cmp.Or(c.Title, DefaultTitle)
	c.GroupLimit = cmp.Or(c.GroupLimit, DefaultGroupLimit)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first, as in New.
func (c Config) Validate() error {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: admin."+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.DB == nil:
		return bad("Config.DB is required (pgxv5.WrapPool, stdsql.WrapDB or wmsql.WrapBeginner)")
	case c.Dialect == nil:
		return bad("Config.Dialect is required (the dialect the forwarder uses)")
	case c.GroupLimit < 1 || c.GroupLimit > 1000:
		return bad("Config.GroupLimit must be between 1 and 1000, got %d", c.GroupLimit)
	case c.PageSize < 1 || c.PageSize > 1000:
		return bad("Config.PageSize must be between 1 and 1000, got %d", c.PageSize)
	case c.MaxPayloadBytes < 1:
		return bad("Config.MaxPayloadBytes must be positive, got %d", c.MaxPayloadBytes)
	case c.Timeout < 0:
		return bad("Config.Timeout must not be negative, got %v", c.Timeout)
	}
	for _, o := range c.TrustedOrigins {
		if err := http.NewCrossOriginProtection().AddTrustedOrigin(o); err != nil {
			return bad("Config.TrustedOrigins: %v", err)
		}
	}
	return nil
}
