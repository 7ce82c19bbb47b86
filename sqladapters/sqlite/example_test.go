package sqlite_test

import (
	"context"
	"database/sql"
	"log"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The SQLite dialect on a database/sql handle of any SQLite driver, opened
// with the settings this package's documentation names. Package
// sqladapters/sqlite/modernc opens one with them (modernc.Open), and its
// runnable examples run the outbox, the forwarder, the inbox and the
// operations on SQLite.
func ExampleNew() {
	ctx := context.Background()
	// With a driver registered as "sqlite", such as modernc.org/sqlite.
	sqlDB, err := sql.Open("sqlite", "file:app.db?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	dialect, err := sqlite.New(sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(sqlDB), dialect); err != nil {
		log.Fatal(err)
	}
}
