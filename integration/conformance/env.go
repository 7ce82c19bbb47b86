package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"testing"

	"github.com/millbox/millbox/sqladapters"
)

// Env describes one database and the ways an application may hold a
// transaction on it.
type Env struct {
	// DB migrates and reads rows back for assertions.
	DB sqladapters.DB
	// NewDialect returns a migrated dialect whose tables belong to this
	// test alone.
	NewDialect func(t *testing.T) sqladapters.Dialect
	// NewUnmigratedDialect returns a dialect whose tables do not exist.
	NewUnmigratedDialect func(t *testing.T) sqladapters.Dialect
	// Sources are the transaction sources to run the outbox suite with.
	Sources []TxSource
}

// TxSource begins transactions the way one kind of application does.
type TxSource struct {
	Name string
	// Begin starts a transaction; it may register cleanup on t.
	Begin func(t *testing.T, ctx context.Context) sqladapters.Tx
	// Sequential is true when the source cannot run transactions
	// concurrently.
	Sequential bool
}

// Row is an outbox row read back for assertions.
type Row struct {
	ID       int64
	Topic    string
	UUID     string
	Payload  []byte
	Metadata map[string]string
	Key      string
	Attempts int
}

// ReadPending returns every pending row of d in id order.
func ReadPending(t testing.TB, ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect) []Row {
	t.Helper()
	rows, err := d.SelectPending(sqladapters.PendingQuery{Limit: 1 << 30}).Query(ctx, db)
	if err != nil {
		t.Fatalf("select pending: %v", d.ClassifyError(err))
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var md []byte
		var key sql.NullString
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &md, &key, &r.Attempts); err != nil {
			t.Fatalf("scan pending: %v", err)
		}
		r.Key = key.String
		if err := json.Unmarshal(md, &r.Metadata); err != nil {
			t.Fatalf("metadata %q is not JSON: %v", md, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("read pending: %v", err)
	}
	return out
}
