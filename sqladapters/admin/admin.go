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
	// DefaultMaxFieldBytes is how much of a long field a message page
	// shows before a link to the whole of it.
	DefaultMaxFieldBytes = 64 << 10
	// DefaultMaxConcurrent is how many requests may read or change the
	// database at once.
	DefaultMaxConcurrent = 4
	// DefaultWarnPendingAge is the age of the oldest pending message past
	// which the overview warns.
	DefaultWarnPendingAge = time.Minute
	// MinFormKeyBytes is the shortest Config.FormKey.
	MinFormKeyBytes = 32
	// MinRefresh and MaxRefresh bound the auto-refresh interval.
	MinRefresh = 5 * time.Second
	MaxRefresh = time.Hour
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
	// forwarder. Required.
	Dialect sqladapters.Dialect

	// View reports whether the request may see the page at all; others
	// get 403 Forbidden. It is called on every request before anything
	// else, and must be safe for concurrent use. Defaults to nil: whoever
	// reaches the handler sees the page, its payloads and errors
	// included; mount it behind the application's login.
	View func(r *http.Request) bool
	// Authorize reports whether the request may change anything
	// (requeue or discard dead letters). It is called on every request
	// View allowed: on pages to decide whether to show the buttons, on
	// changes to allow or refuse them (403). It must be safe for
	// concurrent use. Defaults to nil: the page is read-only.
	Authorize func(r *http.Request) bool
	// TrustedOrigins are origins, such as "https://ops.example.com",
	// allowed to send changes although they differ from the request's
	// Host, for a reverse proxy that rewrites it. Defaults to none.
	TrustedOrigins []string

	// FormKey signs the token of every form, bound to the browser's
	// cookie of this page (and to the application's session cookie, see
	// SessionCookie). Give every replica of the application the same key
	// of at least MinFormKeyBytes random bytes, so that a form rendered
	// by one is accepted by another. Defaults to a random key per
	// handler: forms stop working when the process restarts.
	FormKey []byte
	// SessionCookie names the application's login cookie. When set, a
	// form token is valid only with the session it was rendered for:
	// logging out, or in as someone else, voids it. Defaults to "": the
	// token is bound to this page's own cookie only.
	SessionCookie string
	// BehindTLSProxy tells that browsers reach the page over HTTPS
	// although the handler receives plain HTTP from a proxy that
	// terminates TLS. Cookies then carry Secure and the __Host- prefix,
	// as they do when the request itself came over TLS. Defaults to
	// false.
	BehindTLSProxy bool
	// MaxConcurrent bounds the requests that read or change the
	// database at once; a request beyond it is answered 503 Service
	// Unavailable with Retry-After instead of queueing more scans on a
	// struggling database. Defaults to DefaultMaxConcurrent.
	MaxConcurrent int

	// Warnings set when the overview marks a number as a warning.
	Warnings Warnings
	// Refresh reloads the overview every Refresh, from 5 s to an hour.
	// Defaults to 0: no automatic reload; the page offers one anyway.
	Refresh time.Duration

	// Title heads the page, to tell installations apart. Defaults to
	// DefaultTitle.
	Title string
	// GroupLimit is the most error groups the overview lists. Defaults
	// to DefaultGroupLimit.
	GroupLimit int
	// PageSize is the most dead letters one list page shows. Defaults to
	// DefaultPageSize.
	PageSize int
	// MaxFieldBytes is how much of a long field (payload, metadata,
	// error, key, topic) a message page shows; a link shows the whole.
	// Defaults to DefaultMaxFieldBytes.
	MaxFieldBytes int
	// Timeout bounds the database work of one request. A requeue or
	// discard of a group too large for it stops after the batches done
	// so far and reports the error; submitting it again continues.
	// Defaults to DefaultTimeout.
	Timeout time.Duration
	// Logger receives server errors, once per cause, and refused
	// changes. Defaults to slog.Default().
	Logger *slog.Logger
}

// Warnings set when the overview marks a number as a warning.
type Warnings struct {
	// PendingAge warns when the oldest pending message has waited
	// longer. Defaults to DefaultWarnPendingAge; negative turns the
	// warning off.
	PendingAge time.Duration
	// DeadLetters warns when more dead letters wait. Defaults to 0: any
	// dead letter; negative turns the warning off.
	DeadLetters int64
	// IgnoreLeases turns off the warning that no forwarder holds a
	// partition, for an outbox forwarded by change data capture, which
	// takes no leases. Defaults to false.
	IgnoreLeases bool
}

func (c *Config) setDefaults() {
	c.Title = cmp.Or(c.Title, DefaultTitle)
	c.GroupLimit = cmp.Or(c.GroupLimit, DefaultGroupLimit)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.MaxFieldBytes = cmp.Or(c.MaxFieldBytes, DefaultMaxFieldBytes)
	c.MaxConcurrent = cmp.Or(c.MaxConcurrent, DefaultMaxConcurrent)
	c.Timeout = cmp.Or(c.Timeout, DefaultTimeout)
	c.Warnings.PendingAge = cmp.Or(c.Warnings.PendingAge, DefaultWarnPendingAge)
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
	case c.MaxFieldBytes < 1:
		return bad("Config.MaxFieldBytes must be positive, got %d", c.MaxFieldBytes)
	case c.MaxConcurrent < 1 || c.MaxConcurrent > 1000:
		return bad("Config.MaxConcurrent must be between 1 and 1000, got %d", c.MaxConcurrent)
	case c.Timeout < 0:
		return bad("Config.Timeout must not be negative, got %v", c.Timeout)
	case c.Refresh != 0 && (c.Refresh < MinRefresh || c.Refresh > MaxRefresh):
		return bad("Config.Refresh must be 0 or between %v and %v, got %v", MinRefresh, MaxRefresh, c.Refresh)
	case c.FormKey != nil && len(c.FormKey) < MinFormKeyBytes:
		return bad("Config.FormKey must hold at least %d bytes, got %d", MinFormKeyBytes, len(c.FormKey))
	case c.SessionCookie != "" && !validCookieName(c.SessionCookie):
		return bad("Config.SessionCookie %q is not a cookie name", c.SessionCookie)
	}
	for _, o := range c.TrustedOrigins {
		if err := http.NewCrossOriginProtection().AddTrustedOrigin(o); err != nil {
			return bad("Config.TrustedOrigins: %v", err)
		}
	}
	return nil
}

// validCookieName reports whether name is an HTTP token, as a cookie's
// name must be.
func validCookieName(name string) bool {
	for _, c := range []byte(name) {
		if c <= ' ' || c >= 0x7f || c == '=' || c == ';' || c == ',' || c == '"' || c == '\\' || c == '(' || c == ')' ||
			c == '<' || c == '>' || c == '@' || c == ':' || c == '/' || c == '[' || c == ']' || c == '?' || c == '{' || c == '}' {
			return false
		}
	}
	return len(name) > 0 && len(name) <= 256
}
