package modernc_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
)

func TestSQLiteDSN(t *testing.T) {
	dsn, err := modernc.DSN("/data/app.db", modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	want := "file:/data/app.db?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	if dsn != want {
		t.Fatalf("DSN\n got %s\nwant %s", dsn, want)
	}
	dsn, err = modernc.DSN("dir?x#y%z/a.db", modernc.Config{BusyTimeout: 250 * time.Millisecond, SynchronousFull: true})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(dsn, "file:dir%3Fx%23y%25z/a.db?_pragma=busy_timeout(250)&") || !strings.Contains(dsn, "synchronous(FULL)") {
		t.Fatalf("DSN %s", dsn)
	}
}

func TestSQLiteConfigRejected(t *testing.T) {
	cases := map[string]struct {
		path string
		cfg  modernc.Config
		want string
	}{
		"empty path":     {"", modernc.Config{}, "empty database path"},
		"memory":         {":memory:", modernc.Config{}, "not a file path"},
		"URI":            {"file:x.db?mode=ro", modernc.Config{}, "not a file path"},
		"one connection": {"x.db", modernc.Config{MaxOpenConns: 1}, "Config.MaxOpenConns"},
		"sub-ms busy":    {"x.db", modernc.Config{BusyTimeout: time.Microsecond}, "Config.BusyTimeout"},
		"negative busy":  {"x.db", modernc.Config{BusyTimeout: -time.Second}, "Config.BusyTimeout"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := modernc.Open(c.path, c.cfg)
			if !errors.Is(err, modernc.ErrInvalidConfig) || !errors.Is(err, sqladapters.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want ErrInvalidConfig naming %q, got %v", c.want, err)
			}
		})
	}
}

// TestSQLiteOpenAppliesSettings checks every pooled connection gets the settings,
// and that write transactions take the lock when they begin.
func TestSQLiteOpenAppliesSettings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "odd ?#% name.db")
	db, err := modernc.Open(path, modernc.Config{BusyTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := db.Stats().MaxOpenConnections; got != modernc.DefaultMaxOpenConns {
		t.Fatalf("max open conns %d", got)
	}
	ctx := context.Background()
	var conns []*sql.Conn
	for range 3 {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var mode string
		var busy, sync int
		if err := c.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || busy != 300 || sync != 1 {
			t.Fatalf("connection settings: journal_mode=%s busy_timeout=%d synchronous=%d", mode, busy, sync)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the database is not at the escaped path: %v", err)
	}

	// A write transaction holds the lock from BEGIN: a second one waits
	// out the busy timeout and fails, a read-only one does not block.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	start := time.Now()
	if tx2, err := db.BeginTx(ctx, nil); err == nil {
		tx2.Rollback()
		t.Fatal("second write transaction began while the first holds the lock")
	} else if !strings.Contains(err.Error(), "SQLITE_BUSY") || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("want SQLITE_BUSY after the busy timeout, got %v after %v", err, time.Since(start))
	}
	ro, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only transaction blocked by the writer: %v", err)
	}
	var one int
	if err := ro.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	ro.Rollback()
}
