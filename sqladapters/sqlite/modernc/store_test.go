package modernc_test

import (
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
