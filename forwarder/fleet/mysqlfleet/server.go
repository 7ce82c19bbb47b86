package mysqlfleet

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// Defaults of ServerConfig.
const (
	DefaultMaxConns            = 4
	DefaultMinDoorbellInterval = 250 * time.Millisecond
	DefaultMaxDoorbellInterval = time.Second
	DefaultHotFor              = time.Minute
)

// ErrInvalidConfig is sqladapters.ErrInvalidConfig, returned for a bad
// ServerConfig or a bad argument of Open; the error names the field and
// the rule.
var ErrInvalidConfig = sqladapters.ErrInvalidConfig

// DoorbellKind chooses what tells a server's tenants that rows came.
type DoorbellKind int

const (
	// AutoIncrementDoorbell reads the AUTO_INCREMENT counters of the
	// tenants' outbox and scheduled tables in information_schema.TABLES,
	// in one query per look on one connection. See the package
	// documentation for what it costs and misses.
	AutoIncrementDoorbell DoorbellKind = iota
	// NoDoorbell leaves the server's tenants to the fleet's sweep and
	// timers.
	NoDoorbell
)

func (k DoorbellKind) String() string {
	switch k {
	case AutoIncrementDoorbell:
		return "AutoIncrementDoorbell"
	case NoDoorbell:
		return "NoDoorbell"
	}
	return fmt.Sprintf("DoorbellKind(%d)", int(k))
}

// ServerConfig describes a MySQL or MariaDB server of the fleet. Pass it
// by value; zero fields take their defaults.
type ServerConfig struct {
	// DSN is a go-sql-driver/mysql DSN of the server (see
	// sqladapters/mysql for the settings that matter, parseTime=true
	// among them). Its database is the default of tenants that name
	// none, and of handles opened on "". Every connection is dialled
	// through the fleet's DialFunc with the DSN's network and address, so
	// a network registered with mysql.RegisterDialContext is not used.
	// Required.
	DSN string
	// Options names the tenants' tables and tunes the SQL. Leave
	// Database empty: a tenant's database comes from
	// fleet.Tenant.Database, and its dialect qualifies every table with
	// it, so one handle serves every tenant of the server. Defaults to
	// mysql's defaults.
	Options mysql.Options
	// Doorbell chooses what tells the tenants that rows came. Defaults to
	// AutoIncrementDoorbell.
	Doorbell DoorbellKind
	// MinDoorbellInterval is how often the doorbell looks while a tenant
	// of the server rang within HotFor; MaxDoorbellInterval how often
	// otherwise. Default to DefaultMinDoorbellInterval and
	// DefaultMaxDoorbellInterval.
	MinDoorbellInterval, MaxDoorbellInterval time.Duration
	// HotFor is how long after a ring the doorbell keeps looking every
	// MinDoorbellInterval. Defaults to DefaultHotFor.
	HotFor time.Duration
	// MaxConns bounds the connections of one handle; the fleet's DialFunc
	// bounds what all handles hold together. Defaults to DefaultMaxConns.
	MaxConns int
}

func (c *ServerConfig) setDefaults() {
	c.MinDoorbellInterval = cmp.Or(c.MinDoorbellInterval, DefaultMinDoorbellInterval)
	c.MaxDoorbellInterval = cmp.Or(c.MaxDoorbellInterval, DefaultMaxDoorbellInterval)
	c.HotFor = cmp.Or(c.HotFor, DefaultHotFor)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first.
func (c ServerConfig) Validate() error {
	_, err := c.parse()
	return err
}

func (c ServerConfig) parse() (*mysqldrv.Config, error) {
	c.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case c.DSN == "":
		return nil, bad("mysqlfleet.ServerConfig.DSN is required")
	case c.Options.Database != "":
		return nil, bad("mysqlfleet.ServerConfig.Options.Database must be empty, got %q: a tenant's database comes from fleet.Tenant.Database", c.Options.Database)
	case c.Doorbell < AutoIncrementDoorbell || c.Doorbell > NoDoorbell:
		return nil, bad("mysqlfleet.ServerConfig.Doorbell %v is not AutoIncrementDoorbell or NoDoorbell", c.Doorbell)
	case c.MinDoorbellInterval < 10*time.Millisecond:
		return nil, bad("mysqlfleet.ServerConfig.MinDoorbellInterval must be at least 10ms, got %v", c.MinDoorbellInterval)
	case c.MaxDoorbellInterval < c.MinDoorbellInterval:
		return nil, bad("mysqlfleet.ServerConfig.MaxDoorbellInterval %v is below MinDoorbellInterval %v", c.MaxDoorbellInterval, c.MinDoorbellInterval)
	case c.HotFor < 0:
		return nil, bad("mysqlfleet.ServerConfig.HotFor must not be negative, got %v", c.HotFor)
	case c.MaxConns < 1:
		return nil, bad("mysqlfleet.ServerConfig.MaxConns must be positive, got %d", c.MaxConns)
	}
	if _, err := mysql.New(c.Options); err != nil {
		return nil, fmt.Errorf("%w: mysqlfleet.ServerConfig.Options: %w", ErrInvalidConfig, err)
	}
	dc, err := mysqldrv.ParseDSN(c.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: mysqlfleet.ServerConfig.DSN: %w", ErrInvalidConfig, err)
	}
	return dc, nil
}

// Server is a MySQL or MariaDB server of the fleet: it implements
// fleet.Server.
type Server struct {
	cfg    ServerConfig
	dsn    *mysqldrv.Config // parsed; cloned for every handle
	outbox string           // the outbox table's name
	bell   fleet.Doorbell
}

var _ fleet.Server = (*Server)(nil)

// NewServer validates cfg, applies its defaults and returns the server.
// It opens no connection.
func NewServer(cfg ServerConfig) (*Server, error) {
	dc, err := cfg.parse()
	if err != nil {
		return nil, err
	}
	cfg.setDefaults()
	s := &Server{cfg: cfg, dsn: dc, outbox: mysql.MustNew(cfg.Options).Options().OutboxTable}
	if cfg.Doorbell == AutoIncrementDoorbell {
		s.bell = newAutoIncDoorbell(s)
	}
	return s, nil
}

// Config returns the configuration the server was made with, defaults
// applied.
func (s *Server) Config() ServerConfig { return s.cfg }

// database resolves a tenant's database: "" is the DSN's.
func (s *Server) database(name string) string { return cmp.Or(name, s.dsn.DBName) }

// openDB opens a database/sql pool on database ("" is the DSN's) whose
// connections are dialled through dial. It opens no connection yet.
func (s *Server) openDB(database string, dial fleet.DialFunc) (*sql.DB, error) {
	dc := s.dsn.Clone()
	dc.DBName = s.database(database)
	dc.DialFunc = dial
	connector, err := mysqldrv.NewConnector(dc)
	if err != nil {
		return nil, fmt.Errorf("mysqlfleet: %w", err)
	}
	return sql.OpenDB(connector), nil
}

// Open returns a database/sql handle on database ("" is the DSN's) that
// opens no connection until a query needs one, holds at most
// ServerConfig.MaxConns, dials each through dial and closes each once
// idle for longer than idle. database/sql looks for idle connections
// every idle time, but not more often than every second: a connection
// closes between idle and idle + max(idle, 1 s) after its last use. Its
// DB is stdsql.WrapDB of the *sql.DB. The dialects of the tenants qualify
// their tables with their databases, so one handle serves them all.
func (s *Server) Open(ctx context.Context, database string, dial fleet.DialFunc, idle time.Duration) (fleet.Handle, error) {
	switch {
	case dial == nil:
		return nil, fmt.Errorf("%w: mysqlfleet: Open needs a DialFunc", ErrInvalidConfig)
	case idle <= 0:
		return nil, fmt.Errorf("%w: mysqlfleet: Open needs a positive idle time, got %v", ErrInvalidConfig, idle)
	}
	db, err := s.openDB(database, dial)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(s.cfg.MaxConns)
	db.SetMaxIdleConns(s.cfg.MaxConns)
	db.SetConnMaxIdleTime(idle)
	return &handle{sqlDB: db, db: stdsql.WrapDB(db)}, nil
}

// Dialect returns the mysql dialect of ServerConfig.Options with its
// tables in the tenant's database (the DSN's when the tenant names
// none).
func (s *Server) Dialect(t fleet.Tenant) (sqladapters.Dialect, error) {
	opts := s.cfg.Options
	opts.Database = s.database(t.Database)
	if opts.Database == "" {
		return nil, fmt.Errorf("%w: mysqlfleet: tenant %q names no database, and the DSN has none", ErrInvalidConfig, t.ID)
	}
	d, err := mysql.New(opts)
	if err != nil {
		return nil, fmt.Errorf("mysqlfleet: tenant %q: %w", t.ID, err)
	}
	return d, nil
}

// Doorbell returns the doorbell ServerConfig.Doorbell chose, nil for
// NoDoorbell.
func (s *Server) Doorbell() fleet.Doorbell { return s.bell }

// SameDatabase returns true: a connection reaches every database of the
// server, and the tenants' dialects name theirs.
func (s *Server) SameDatabase(a, b fleet.Tenant) bool { return true }

// handle is an open server: a database/sql pool.
type handle struct {
	sqlDB *sql.DB
	db    *stdsql.DB
}

func (h *handle) DB() sqladapters.DB { return h.db }

// Close closes the pool once the queries running have finished.
func (h *handle) Close() { _ = h.sqlDB.Close() }
