package conformance

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
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
	// Sources are the transaction sources to run the outbox suite and the
	// inbox Record suite with.
	Sources []TxSource

	// Placeholder returns the n-th (from 1) bind parameter of this
	// database's SQL, for the statements the suites run on their own
	// business tables. Defaults to "?"; Postgres needs "$n".
	Placeholder func(n int) string
	// TimeArg converts a time into the argument this database compares
	// with millbox's time columns. Defaults to the time itself.
	TimeArg func(t time.Time) any
	// InboxDBs are the handles the inbox middleware suite begins its
	// transactions on, one run each. Defaults to DB alone.
	InboxDBs []DBSource
	// IsolationLevels are the transaction isolation levels at which the
	// inbox reports a concurrent duplicate as a duplicate; the inbox suite
	// races transactions at each. Defaults to the database's default
	// level. (Postgres above READ COMMITTED reports a serialization
	// failure instead; see package inbox.)
	IsolationLevels []sql.IsolationLevel
	// ForwarderSource returns the source the forwarder suites run with for
	// d's outbox. Nil runs them with forwarder.Polling (8 partitions,
	// leases of 2 s). The suites run their source-independent promises
	// with every source, and the promises of one source only where it is
	// that one (SourceKind).
	ForwarderSource func(t testing.TB, d sqladapters.Dialect) forwarder.Source
	// InboxLockWaiters counts the sessions waiting on the inbox table of
	// d, so that the inbox suite ends a transaction only once another one
	// waits on it. The suite calls it while one transaction holds a key
	// whose insert has finished, so a session still running the inbox
	// insert may be counted as waiting. Nil where waits cannot be observed
	// (SQLite waits in its busy handler); the suite then pauses briefly
	// instead, which makes the overlap likely but does not prove it.
	InboxLockWaiters func(ctx context.Context, d sqladapters.Dialect) (int, error)
}

// polling tells whether the forwarder suites run with the polling source.
func (env Env) polling() bool { return env.ForwarderSource == nil }

// source returns the forwarder source for d's outbox.
func (env Env) source(t testing.TB, d sqladapters.Dialect) forwarder.Source {
	if env.ForwarderSource == nil {
		return forwarder.Polling{Partitions: 8, LeaseTTL: 2 * time.Second}
	}
	return env.ForwarderSource(t, d)
}

// DBSource is a database handle as one kind of application opens it.
type DBSource struct {
	Name string
	DB   sqladapters.DB
}

// TxSource begins transactions the way one kind of application does.
type TxSource struct {
	Name string
	// Begin starts a transaction. Suites call it from goroutines other
	// than the test's too, so it reports failure instead of failing the
	// test, and whatever it opens for the transaction is released when the
	// transaction ends.
	Begin func(ctx context.Context) (sqladapters.Tx, error)
	// Sequential is true when the source cannot run transactions
	// concurrently.
	Sequential bool
}

// MustBegin is Begin for the test goroutine: it fails the test if the
// transaction does not begin. It rolls the transaction back after the
// test, so one that a failing test left open releases its connection and
// does not block later tests.
func (s TxSource) MustBegin(t testing.TB, ctx context.Context) sqladapters.Tx {
	t.Helper()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatalf("begin a transaction with %s: %v", s.Name, err)
	}
	t.Cleanup(func() { sqladapters.Rollback(tx) })
	return tx
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
	rows, err := d.ReadPending(ctx, db, sqladapters.PendingQuery{Limit: 1 << 30}, false)
	if err != nil {
		t.Fatalf("read pending: %v", err)
	}
	var out []Row
	for _, p := range rows {
		r := Row{ID: p.ID, Topic: p.Topic, UUID: p.UUID, Payload: p.Payload, Key: p.Key, Attempts: p.Attempts}
		if err := json.Unmarshal(p.Metadata, &r.Metadata); err != nil {
			t.Fatalf("metadata %q is not JSON: %v", p.Metadata, err)
		}
		out = append(out, r)
	}
	return out
}

// SetPollInterval sets how often cfg's forwarder looks at the outbox when
// nothing woke it: the PollInterval of its source (Polling or cdc.Source;
// a nil Source becomes Polling) and its DelayedPollInterval.
func SetPollInterval(cfg *forwarder.Config, d time.Duration) {
	cfg.DelayedPollInterval = d
	cfg.Source = PollEvery(cfg.Source, d)
}

// PollEvery returns src with its PollInterval set to d (Polling or
// cdc.Source; nil becomes Polling).
func PollEvery(src forwarder.Source, d time.Duration) forwarder.Source {
	switch s := src.(type) {
	case nil:
		return forwarder.Polling{PollInterval: d}
	case forwarder.Polling:
		s.PollInterval = d
		return s
	case cdc.Source:
		s.PollInterval = d
		return s
	}
	panic(fmt.Sprintf("PollEvery: unknown source %T", src))
}
