package modernc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// sqladapters.Migrate on SQLite: every instance may run it at start; a
// second run finds the tables up to date and changes nothing.
// sqladapters.MigrationSQL (or `millbox migrate sql`) prints the same
// schema for a migration tool instead.
func Example_migrate() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "millbox-migrate")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqlDB, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	db, dialect := stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{})

	for range 2 {
		if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
			log.Fatal(err)
		}
	}

	rows, err := sqlDB.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'millbox%' ORDER BY name`)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			log.Fatal(err)
		}
		fmt.Println(name)
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// millbox_inbox
	// millbox_outbox
	// millbox_outbox_dead
	// millbox_outbox_kept
	// millbox_outbox_leases
	// millbox_outbox_members
	// millbox_outbox_migrations
	// millbox_outbox_scheduled
}
