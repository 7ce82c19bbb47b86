package pgfleet

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Defaults of ServerConfig.
const (
	// DefaultMaxConns bounds a handle that tenants share: the tenant
	// schemas of one database (SlotDoorbell, NoDoorbell).
	DefaultMaxConns = 4
	// DefaultDatabaseMaxConns bounds a handle of a database per tenant
	// (StatDoorbell): a pool of one connection never holds a place of
	// the budget while it waits for another, so busy tenants cannot stall
	// each other (two more with postgres.Options.Notify, whose listener
	// holds one).
	DefaultDatabaseMaxConns = 1
	DefaultDoorbellInterval = 250 * time.Millisecond
	DefaultApplicationName  = "millbox_fleet"
	// DoorbellSuffix ends the application_name of a doorbell's
	// connections, so that pg_stat_activity tells them from the handles'.
	DoorbellSuffix = "_doorbell"
	// MinHealthCheckPeriod and MaxHealthCheckPeriod bound the health
	// check period a handle derives from its idle time.
	MinHealthCheckPeriod = 100 * time.Millisecond
	MaxHealthCheckPeriod = time.Minute
	// maxApplicationName leaves room for DoorbellSuffix in PostgreSQL's
	// 63 bytes.
	maxApplicationName = 63 - len(DoorbellSuffix)
)

// ErrInvalidConfig is sqladapters.ErrInvalidConfig, returned for a bad
// ServerConfig or a bad argument of Open; the error names the field and
// the rule.
var ErrInvalidConfig = sqladapters.ErrInvalidConfig

// DoorbellKind chooses what tells a server's tenants that rows came.
type DoorbellKind int

const (
	// StatDoorbell polls the insert counters of the tenants' databases in
	// pg_stat_database, on one connection: for a database per tenant.
	// See the package documentation for what it costs and misses.
	StatDoorbell DoorbellKind = iota
	// SlotDoorbell streams the inserts into the tenants' outbox and
	// scheduled tables from a temporary logical replication slot per
	// database: for tenants that are schemas of one database. It needs
	// wal_level=logical and a role with REPLICATION.
	SlotDoorbell
	// NoDoorbell leaves the server's tenants to the fleet's sweep and
	// timers.
	NoDoorbell
)

func (k DoorbellKind) String() string {
	switch k {
	case StatDoorbell:
		return "StatDoorbell"
	case SlotDoorbell:
		return "SlotDoorbell"
	case NoDoorbell:
		return "NoDoorbell"
	}
	return fmt.Sprintf("DoorbellKind(%d)", int(k))
}

// ServerConfig describes a PostgreSQL server of the fleet. Pass it by
// value; zero fields take their defaults.
type ServerConfig struct {
	// DSN is a pgx connection string (URL or key=value) of any database
	// of the server; each handle and doorbell connection replaces its
	// database by the tenant's. Several hosts (a primary and standbys,
	// with target_session_attrs) work as in pgx: every host tried is
	// dialled through the fleet's DialFunc. Required.
	DSN string
	// Options names the tenants' tables. Leave Schema empty: a tenant's
	// schema comes from fleet.Tenant.Schema. With Notify, a forwarder of
	// a tenant listens on a connection of its handle, which it holds as
	// long as it runs. Defaults to postgres's defaults.
	Options postgres.Options
	// Doorbell chooses what tells the tenants that rows came. Defaults to
	// StatDoorbell.
	Doorbell DoorbellKind
	// DoorbellInterval is how often the stat doorbell reads the counters,
	// and how often the slot doorbell looks whether the set of tenants
	// changed (a look at memory; a change costs statements). Defaults to
	// DefaultDoorbellInterval.
	DoorbellInterval time.Duration
	// MaxConns bounds the connections of one handle; the fleet's DialFunc
	// bounds what all handles hold together. A query that finds no idle
	// connection while the handle holds fewer than MaxConns waits for the
	// connection it dials (pgxpool), hence for a place in the fleet's
	// budget, even if another query of the handle gives one back
	// meanwhile: keep MaxConns within what the budget gives a handle.
	// Handles that each hold some connections and wait for one more can
	// hold every place between them and wait on each other until a
	// connection idles out or a query times out. Defaults to
	// DefaultDatabaseMaxConns with StatDoorbell (one tenant per handle;
	// measured: busy tenants' p99 11 s with 4, 435 ms with 1), to
	// DefaultMaxConns otherwise.
	MaxConns int32
	// HealthCheckPeriod is how often a handle closes the connections idle
	// for longer than the idle time it was opened with: an idle
	// connection closes between idle and idle + HealthCheckPeriod after
	// its last use. Defaults to half the idle time, within
	// MinHealthCheckPeriod and MaxHealthCheckPeriod.
	HealthCheckPeriod time.Duration
	// ApplicationName is the application_name of the handles'
	// connections; the doorbells' end with DoorbellSuffix. Count the
	// fleet's connections in pg_stat_activity by it; give each instance
	// its own to count them apart. At most 54 printable ASCII
	// characters. Defaults to DefaultApplicationName.
	ApplicationName string
}

func (c *ServerConfig) setDefaults() {
	c.DoorbellInterval = cmp.Or(c.DoorbellInterval, DefaultDoorbellInterval)
	if c.MaxConns == 0 {
		switch {
		case c.Doorbell != StatDoorbell:
			c.MaxConns = DefaultMaxConns
		case c.Options.Notify:
			c.MaxConns = DefaultDatabaseMaxConns + 1
		default:
			c.MaxConns = DefaultDatabaseMaxConns
		}
	}
	c.ApplicationName = cmp.Or(c.ApplicationName, DefaultApplicationName)
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first.
func (c ServerConfig) Validate() error {
	_, err := c.parse()
	return err
}

func (c ServerConfig) parse() (*pgxpool.Config, error) {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.DSN == "":
		return nil, bad("pgfleet.ServerConfig.DSN is required")
	case c.Options.Schema != "":
		return nil, bad("pgfleet.ServerConfig.Options.Schema must be empty, got %q: a tenant's schema comes from fleet.Tenant.Schema", c.Options.Schema)
	case c.Doorbell < StatDoorbell || c.Doorbell > NoDoorbell:
		return nil, bad("pgfleet.ServerConfig.Doorbell %v is not StatDoorbell, SlotDoorbell or NoDoorbell", c.Doorbell)
	case c.DoorbellInterval < 10*time.Millisecond:
		return nil, bad("pgfleet.ServerConfig.DoorbellInterval must be at least 10ms, got %v", c.DoorbellInterval)
	case c.MaxConns < 1:
		return nil, bad("pgfleet.ServerConfig.MaxConns must be positive, got %d", c.MaxConns)
	case c.HealthCheckPeriod < 0:
		return nil, bad("pgfleet.ServerConfig.HealthCheckPeriod must not be negative, got %v", c.HealthCheckPeriod)
	case len(c.ApplicationName) > maxApplicationName:
		return nil, bad("pgfleet.ServerConfig.ApplicationName %q is longer than %d bytes", c.ApplicationName, maxApplicationName)
	}
	for _, r := range c.ApplicationName {
		if r < ' ' || r > '~' {
			return nil, bad("pgfleet.ServerConfig.ApplicationName %q must be printable ASCII (PostgreSQL replaces other characters)", c.ApplicationName)
		}
	}
	if _, err := postgres.New(c.Options); err != nil {
		return nil, fmt.Errorf("%w: pgfleet.ServerConfig.Options: %w", ErrInvalidConfig, err)
	}
	pc, err := pgxpool.ParseConfig(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: pgfleet.ServerConfig.DSN: %w", ErrInvalidConfig, err)
	}
	return pc, nil
}

// Server is a PostgreSQL server of the fleet: it implements fleet.Server.
type Server struct {
	cfg  ServerConfig
	pool *pgxpool.Config // the parsed DSN; copied for every handle
	bell fleet.Doorbell
}

var _ fleet.Server = (*Server)(nil)

// NewServer validates cfg, applies its defaults and returns the server.
// It opens no connection.
func NewServer(cfg ServerConfig) (*Server, error) {
	pc, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Server{cfg: cfg, pool: pc}
	switch cfg.Doorbell {
	case StatDoorbell:
		s.bell = newStatDoorbell(s)
	case SlotDoorbell:
		s.bell = newSlotDoorbell(s)
	}
	return s, nil
}

// Config returns the configuration the server was made with, defaults
// applied.
func (s *Server) Config() ServerConfig { return s.cfg }

// database resolves a tenant's database: "" is the DSN's.
func (s *Server) database(name string) string {
	if name == "" {
		return s.pool.ConnConfig.Database
	}
	return name
}

// connConfig returns the DSN's connection settings for database, with
// every connection dialled through dial (pgconn dials the DSN's fallback
// hosts through it too) and named by suffix after ApplicationName.
func (s *Server) connConfig(database string, dial fleet.DialFunc, suffix string) *pgx.ConnConfig {
	cc := s.pool.ConnConfig.Copy()
	cc.Database = s.database(database)
	cc.DialFunc = pgconn.DialFunc(dial)
	cc.RuntimeParams["application_name"] = s.cfg.ApplicationName + suffix
	return cc
}

// Open returns a pgxpool handle on database ("" is the DSN's): no
// connection at first (it opens none until a query needs one), at most
// ServerConfig.MaxConns, every one dialled through dial, each closed once
// idle for longer than idle (checked every HealthCheckPeriod). Its DB is
// pgxv5.WrapPool of the pool.
func (s *Server) Open(ctx context.Context, database string, dial fleet.DialFunc, idle time.Duration) (fleet.Handle, error) {
	switch {
	case dial == nil:
		return nil, fmt.Errorf("%w: pgfleet: Open needs a DialFunc", ErrInvalidConfig)
	case idle <= 0:
		return nil, fmt.Errorf("%w: pgfleet: Open needs a positive idle time, got %v", ErrInvalidConfig, idle)
	}
	pc := s.pool.Copy()
	pc.ConnConfig = s.connConfig(database, dial, "")
	pc.MinConns, pc.MinIdleConns = 0, 0
	pc.MaxConns = s.cfg.MaxConns
	pc.MaxConnIdleTime = idle
	pc.HealthCheckPeriod = s.cfg.HealthCheckPeriod
	if pc.HealthCheckPeriod == 0 {
		pc.HealthCheckPeriod = min(max(idle/2, MinHealthCheckPeriod), MaxHealthCheckPeriod)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgfleet: open database %q: %w", pc.ConnConfig.Database, err)
	}
	return &handle{pool: pool, db: pgxv5.WrapPool(pool)}, nil
}

// Dialect returns the postgres dialect of ServerConfig.Options in the
// tenant's schema.
func (s *Server) Dialect(t fleet.Tenant) (sqladapters.Dialect, error) {
	opts := s.cfg.Options
	opts.Schema = t.Schema
	d, err := postgres.New(opts)
	if err != nil {
		return nil, fmt.Errorf("pgfleet: tenant %q: %w", t.ID, err)
	}
	return d, nil
}

// Doorbell returns the doorbell ServerConfig.Doorbell chose, nil for
// NoDoorbell.
func (s *Server) Doorbell() fleet.Doorbell { return s.bell }

// SameDatabase tells whether a and b live in one database ("" being the
// DSN's): a connection reaches the schemas of its database only.
func (s *Server) SameDatabase(a, b fleet.Tenant) bool {
	return s.database(a.Database) == s.database(b.Database)
}

// handle is an open database: a pool.
type handle struct {
	pool *pgxpool.Pool
	db   *pgxv5.DB
}

func (h *handle) DB() sqladapters.DB { return h.db }

// Close closes the pool, once the connections in use are back.
func (h *handle) Close() { h.pool.Close() }
