package modernc

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"

	// Registers the "sqlite" database/sql driver.
	_ "modernc.org/sqlite"
)

const (
	// DriverName is the database/sql driver name modernc.org/sqlite
	// registers.
	DriverName = "sqlite"
	// DefaultBusyTimeout is how long a writer waits for the write lock
	// before failing with SQLITE_BUSY.
	DefaultBusyTimeout = 5 * time.Second
	// DefaultMaxOpenConns bounds the pool: enough readers to run beside
	// the writer, few enough that waiting writers queue in database/sql
	// rather than poll SQLite's lock.
	DefaultMaxOpenConns = 8
)

// ErrInvalidConfig is returned for a bad Config or path. It wraps
// sqladapters.ErrInvalidConfig, which every millbox package's config errors
// match.
var ErrInvalidConfig = fmt.Errorf("%w (sqlite/modernc)", sqladapters.ErrInvalidConfig)

// Config tunes the connection settings.
type Config struct {
	// BusyTimeout is how long a statement waits for a lock another
	// connection holds. Whole milliseconds. Defaults to DefaultBusyTimeout.
	BusyTimeout time.Duration
	// MaxOpenConns bounds the pool; a negative value removes the bound.
	// One connection is refused: it deadlocks code that holds a
	// transaction and queries the pool (see package sqladapters/sqlite).
	// Defaults to DefaultMaxOpenConns.
	MaxOpenConns int
	// SynchronousFull sets synchronous=FULL instead of NORMAL, so a power
	// loss cannot lose committed transactions, at the cost of an fsync per
	// commit. Defaults to false.
	SynchronousFull bool
}

func (c *Config) setDefaults() {
	c.BusyTimeout = cmp.Or(c.BusyTimeout, DefaultBusyTimeout)
	if c.MaxOpenConns == 0 {
		c.MaxOpenConns = DefaultMaxOpenConns
	}
}

// Validate names the first invalid field.
func (c Config) Validate() error {
	if c.BusyTimeout < time.Millisecond {
		return fmt.Errorf("%w: Config.BusyTimeout %v must be at least 1ms", ErrInvalidConfig, c.BusyTimeout)
	}
	if c.MaxOpenConns == 1 {
		return fmt.Errorf("%w: Config.MaxOpenConns %d must not be 1: with one connection, holding a transaction and querying the pool deadlocks",
			ErrInvalidConfig, c.MaxOpenConns)
	}
	return nil
}

// DSN returns the modernc.org/sqlite data source name for the database file
// at path, with cfg's defaults applied:
//
//	file:<path>?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate
//
// path is a file path, not a URI; characters with a meaning in URIs are
// escaped. In-memory databases are refused: they cannot use WAL, and each
// pooled connection would get a database of its own.
func DSN(path string, cfg Config) (string, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return "", err
	}
	switch {
	case path == "":
		return "", fmt.Errorf("%w: empty database path", ErrInvalidConfig)
	case path == ":memory:" || strings.HasPrefix(path, "file:"):
		return "", fmt.Errorf("%w: path %q is not a file path; open in-memory databases or URIs with sql.Open(%q, ...) yourself",
			ErrInvalidConfig, path, DriverName)
	}
	synchronous := "NORMAL"
	if cfg.SynchronousFull {
		synchronous = "FULL"
	}
	return "file:" + escapePath(path) +
		"?_pragma=busy_timeout(" + strconv.FormatInt(cfg.BusyTimeout.Milliseconds(), 10) + ")" +
		"&_pragma=journal_mode(WAL)" +
		"&_pragma=synchronous(" + synchronous + ")" +
		"&_txlock=immediate", nil
}

// escapePath escapes the characters that end or escape the path part of an
// SQLite URI filename.
func escapePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3F", "#", "%23").Replace(p)
}

// Open opens the SQLite database file at path (created if missing) with the
// settings of DSN and the pool bounded by cfg.MaxOpenConns. Unlike sql.Open
// it connects once before returning: switching a new file to WAL needs an
// exclusive lock that SQLite does not wait for, so connections opening a
// new file at the same moment could fail with SQLITE_BUSY. Wrap the result
// with stdsql.WrapDB for millbox, and use it for your own queries too.
func Open(path string, cfg Config) (*sql.DB, error) {
	cfg.setDefaults()
	dsn, err := DSN(path, cfg)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(DriverName, dsn)
	if err != nil {
		return nil, fmt.Errorf("millbox: sqlite/modernc: open %s: %w", path, err)
	}
	if cfg.MaxOpenConns > 0 {
		db.SetMaxOpenConns(cfg.MaxOpenConns)
		// Idle connections keep their page cache warm.
		db.SetMaxIdleConns(cfg.MaxOpenConns)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.BusyTimeout+5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("millbox: sqlite/modernc: open %s: %w", path, err)
	}
	return db, nil
}
