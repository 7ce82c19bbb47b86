package fleet

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Config.
const (
	DefaultLeaseTTL          = 15 * time.Second
	DefaultMaxConns          = 32
	DefaultMaxConnsPerServer = 8
	DefaultSweepInterval     = 5 * time.Minute
	DefaultMinHold           = 2 * time.Second
	DefaultMaxHold           = time.Minute
	DefaultCatalogInterval   = time.Second
	DefaultTenantAttrLimit   = 100
)

// Config configures a Fleet. Pass it by value; New applies defaults to its
// copy and validates it.
type Config struct {
	// Control is the database holding the fleet's own tables (members,
	// the catalog of tenants and who holds each): a database the
	// application already runs. Required.
	Control sqladapters.DB
	// Store is the control tables' store: postgres.NewFleet,
	// mysql.NewFleet or sqlite.NewFleet. Create its tables with
	// sqladapters.MigrateFleet. Required.
	Store sqladapters.FleetStore
	// Servers are the database servers tenants live on, by the name a
	// Tenant's Server gives: pgfleet.NewServer, mysqlfleet.NewServer.
	// Required.
	Servers map[string]Server
	// Tenants, when set, is the application's list of its tenants: the
	// fleet reads it every CatalogInterval and makes the catalog in
	// Control match it (a tenant added is forwarded without a restart,
	// one missing is let go). Without it, the application writes the
	// catalog itself (Fleet.PutTenants, Fleet.RemoveTenants, or the
	// store).
	Tenants func() ([]Tenant, error)
	// CatalogInterval is how often the catalog (and Tenants) is looked at
	// for changes: one cheap query. Defaults to DefaultCatalogInterval.
	CatalogInterval time.Duration

	// Destination is where every tenant's messages go. Required.
	Destination message.Publisher
	// Forwarder is the template of each tenant's forwarder: BatchSize,
	// Concurrency, PublishBatch, PublishTimeout, Retry, MaxAttempts,
	// DeadLetterHoldsKey, KeepForwarded, ExactlyOnce, Topic, Hooks and
	// Telemetry apply to every tenant. Its DB, Dialect, Destination,
	// Source, Wake and Logger are the fleet's to set.
	Forwarder forwarder.Config
	// Partitions is Polling.Partitions of every tenant's outbox (the unit
	// of an exactly-once transaction). Defaults to
	// forwarder.DefaultPartitions.
	Partitions int

	// InstanceID names this instance in the control tables. Defaults to
	// hostname-pid-random.
	InstanceID string
	// LeaseTTL is how long this instance's tenants stay its own without
	// a heartbeat: the tenants of an instance that died or froze move to
	// the others after it. Defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration

	// MaxConns bounds the connections this instance holds to tenant
	// servers, all tenants together; MaxConnsPerServer bounds those to
	// one server. A doorbell's own connection and the control database's
	// are not counted. Default to DefaultMaxConns and
	// DefaultMaxConnsPerServer.
	MaxConns, MaxConnsPerServer int
	// SweepInterval is how often an idle tenant is looked at when no
	// doorbell rang for it: the bound on what a doorbell may miss.
	// Defaults to DefaultSweepInterval.
	SweepInterval time.Duration
	// MinHold and MaxHold bound how long a tenant keeps its connections
	// and its forwarder after its last message: four times the mean time
	// between its messages, within these bounds. Default to
	// DefaultMinHold and DefaultMaxHold.
	MinHold, MaxHold time.Duration

	// MigrateTenants migrates every tenant's millbox tables when this
	// instance first looks at it (sqladapters.Migrate: safe from every
	// instance at once). Defaults to false: a tenant without its tables
	// is reported down, with how to migrate.
	MigrateTenants bool
	// TenantAttribute adds the attribute millbox.tenant, the tenant's
	// ID, to every metric and span of the tenants' forwarders, for the
	// first TenantAttrLimit tenants this instance serves (the others
	// carry "other"), so that the number of time series stays bounded.
	// Defaults to false: the tenants' series are told apart only by
	// their outbox table.
	TenantAttribute bool
	// TenantAttrLimit bounds the tenants named by TenantAttribute.
	// Defaults to DefaultTenantAttrLimit.
	TenantAttrLimit int

	// Logger receives the fleet's logs and those of its forwarders (with
	// the field tenant). Defaults to the log/slog default logger, with
	// Watermill's info level mapped to debug.
	Logger watermill.LoggerAdapter
}

func (c *Config) setDefaults() {
	c.CatalogInterval = cmp.Or(c.CatalogInterval, DefaultCatalogInterval)
	c.Partitions = cmp.Or(c.Partitions, forwarder.DefaultPartitions)
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), watermill.NewShortUUID())
	}
	c.LeaseTTL = cmp.Or(c.LeaseTTL, DefaultLeaseTTL)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.MaxConnsPerServer = cmp.Or(c.MaxConnsPerServer, DefaultMaxConnsPerServer)
	c.SweepInterval = cmp.Or(c.SweepInterval, DefaultSweepInterval)
	c.MinHold = cmp.Or(c.MinHold, DefaultMinHold)
	c.MaxHold = cmp.Or(c.MaxHold, DefaultMaxHold)
	c.TenantAttrLimit = cmp.Or(c.TenantAttrLimit, DefaultTenantAttrLimit)
	if c.Logger == nil {
		c.Logger = watermill.NewSlogLoggerWithLevelMapping(nil, map[slog.Level]slog.Level{slog.LevelInfo: slog.LevelDebug})
	}
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first, as in New.
func (c Config) Validate() error {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{sqladapters.ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.Control == nil:
		return bad("fleet.Config.Control (the database of the fleet's own tables) is required")
	case c.Store == nil:
		return bad("fleet.Config.Store is required (postgres.NewFleet, mysql.NewFleet or sqlite.NewFleet)")
	case len(c.Servers) == 0:
		return bad("fleet.Config.Servers is required: the servers tenants live on, by name")
	case c.Destination == nil:
		return bad("fleet.Config.Destination (the publisher messages go to) is required")
	case c.Partitions < 1 || c.Partitions > 4096:
		return bad("fleet.Config.Partitions must be between 1 and 4096, got %d", c.Partitions)
	case len(c.InstanceID) > 200:
		return bad("fleet.Config.InstanceID must be at most 200 bytes")
	case c.LeaseTTL < 300*time.Millisecond:
		return bad("fleet.Config.LeaseTTL must be at least 300ms, got %v", c.LeaseTTL)
	case c.MaxConns < 1:
		return bad("fleet.Config.MaxConns must be at least 1, got %d", c.MaxConns)
	case c.MaxConnsPerServer < 1 || c.MaxConnsPerServer > c.MaxConns:
		return bad("fleet.Config.MaxConnsPerServer must be between 1 and MaxConns (%d), got %d", c.MaxConns, c.MaxConnsPerServer)
	case c.SweepInterval < time.Second:
		return bad("fleet.Config.SweepInterval must be at least 1s, got %v", c.SweepInterval)
	case c.MinHold < 10*time.Millisecond || c.MaxHold < c.MinHold:
		return bad("fleet.Config.MinHold (%v) must be at least 10ms and at most MaxHold (%v)", c.MinHold, c.MaxHold)
	case c.CatalogInterval < 10*time.Millisecond:
		return bad("fleet.Config.CatalogInterval must be at least 10ms, got %v", c.CatalogInterval)
	}
	for name, s := range c.Servers {
		if s == nil {
			return bad("fleet.Config.Servers[%q] is nil", name)
		}
	}
	// The template is validated as a tenant's forwarder would be, with
	// the dialect of a tenant of some server.
	for name, s := range c.Servers {
		d, err := s.Dialect(Tenant{ID: "validate", Server: name})
		if err != nil {
			return fmt.Errorf("fleet.Config.Servers[%q]: %w", name, err)
		}
		tmpl := c.Forwarder
		tmpl.DB, tmpl.Dialect, tmpl.Destination, tmpl.Source = noDB{}, d, c.Destination, nil
		if err := tmpl.Validate(); err != nil {
			return fmt.Errorf("fleet.Config.Forwarder: %w", err)
		}
		break
	}
	return nil
}

// noDB stands in for a tenant's database where only a config is checked.
type noDB struct{}

func (noDB) Exec(context.Context, string, ...any) (int64, error) { return 0, errNoDB }
func (noDB) Query(context.Context, string, ...any) (sqladapters.Rows, error) {
	return nil, errNoDB
}
func (noDB) Begin(context.Context, sql.TxOptions) (sqladapters.Tx, error) { return nil, errNoDB }

var errNoDB = errors.New("millbox fleet: no database")

// ValidateTenant names what is wrong with t for a fleet of cfg's servers.
func (c Config) ValidateTenant(t Tenant) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{sqladapters.ErrInvalidConfig}, args...)...)
	}
	switch {
	case t.ID == "":
		return bad("a tenant needs an ID")
	case len(t.ID) > 200 || !utf8.ValidString(t.ID) || strings.IndexByte(t.ID, 0) >= 0:
		return bad("tenant ID %.60q must be at most 200 bytes of UTF-8 without NUL", t.ID)
	case c.Servers[t.Server] == nil:
		return bad("tenant %q names server %q, which fleet.Config.Servers does not have", t.ID, t.Server)
	}
	if _, err := c.Servers[t.Server].Dialect(t); err != nil {
		return fmt.Errorf("tenant %q: %w", t.ID, err)
	}
	return nil
}
