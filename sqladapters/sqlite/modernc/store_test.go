package modernc_test

import (
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/storetest"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestStore runs the store contract's suite on SQLite, opened with the
// settings of Open.
func TestStore(t *testing.T) {
	db, err := modernc.Open(filepath.Join(t.TempDir(), "store.db"), modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	storetest.Run(t, storetest.Setup{
		DB: stdsql.WrapDB(db),
		New: func(t *testing.T) sqladapters.Dialect {
			outbox := dialecttest.UniqueName("o_")
			return sqlite.MustNew(sqlite.Options{OutboxTable: outbox, InboxTable: outbox + "_inbox"})
		},
		InUse: func() int { return db.Stats().InUse },
	})
}

// TestFleetStore runs the fleet store's suite on SQLite, opened with the
// settings of Open, and with deferred transactions, which cannot wait for
// the write lock once they have read: the store's own transactions write
// first.
func TestFleetStore(t *testing.T) {
	for name, open := range map[string]func(path string) (*sql.DB, error){
		"Open": func(path string) (*sql.DB, error) { return modernc.Open(path, modernc.Config{}) },
		"deferred": func(path string) (*sql.DB, error) {
			return sql.Open(modernc.DriverName, "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		},
	} {
		t.Run(name, func(t *testing.T) {
			db, err := open(filepath.Join(t.TempDir(), "fleet.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			storetest.RunFleet(t, storetest.FleetSetup{
				DB: stdsql.WrapDB(db),
				New: func(t *testing.T) sqladapters.FleetStore {
					return sqlite.MustNewFleet(sqlite.FleetOptions{Prefix: dialecttest.UniqueName("f_")})
				},
				InUse: func() int { return db.Stats().InUse },
			})
		})
	}
}
