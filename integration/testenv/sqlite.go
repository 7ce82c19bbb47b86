package testenv

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
)

// SQLitePath returns the path of a fresh database file in the test's
// temporary directory, removed after the test.
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "millbox.db")
}

// SQLite opens path with the modernc helper's settings (WAL, busy timeout,
// BEGIN IMMEDIATE) and closes it after the test. SQLite needs no service.
func SQLite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := modernc.Open(path, modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// SQLiteDialect returns a migrated SQLite dialect whose tables have names
// unique to the test, so many tests share one database file.
func SQLiteDialect(t testing.TB, db sqladapters.DB, opts sqlite.Options) *sqlite.Dialect {
	t.Helper()
	if opts.OutboxTable == "" {
		opts.OutboxTable = UniqueName("outbox_")
	}
	if opts.InboxTable == "" {
		opts.InboxTable = UniqueName("inbox_")
	}
	d, err := sqlite.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}
