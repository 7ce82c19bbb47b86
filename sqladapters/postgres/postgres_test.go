package postgres_test

import (
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestDialect runs the checks every dialect shares.
func TestDialect(t *testing.T) {
	custom := postgres.Options{Schema: "app", OutboxTable: "events", Notify: true}
	dialecttest.Exercise(t, dialecttest.Spec[postgres.Options]{
		Name:    "postgres",
		New:     func(o postgres.Options) (sqladapters.Dialect, error) { return postgres.New(o) },
		MustNew: func(o postgres.Options) sqladapters.Dialect { return postgres.MustNew(o) },
		Outbox:  `"millbox_outbox"`,
		Inbox:   `"millbox_inbox"`,
		Features: sqladapters.Features{
			TransactionalDDL: true, SkipLocked: true, ConcurrentWriters: true, ExcludeInSQL: true, HighWaterMark: true, Horizon: true,
			LogicalReplication: true,
		},
		BadNames: map[string]postgres.Options{
			"schema quote": {Schema: `public"; DROP SCHEMA public; --`},
			"space":        {OutboxTable: "outbox x"},
			"quote":        {InboxTable: `inbox"`},
			"too long":     {OutboxTable: strings.Repeat("a", postgres.MaxTableNameLength+1)},
			"same name":    {OutboxTable: "same", InboxTable: "same"},
		},
		Longest:         postgres.Options{OutboxTable: strings.Repeat("a", postgres.MaxTableNameLength)},
		Statements:      []postgres.Options{custom},
		Placeholder:     dialecttest.Dollar,
		Quote:           '"',
		Qualified:       custom,
		Qualifier:       `"app".`,
		Duplicate:       []error{pgErr("23505")},
		Missing:         []error{pgErr("42P01")},
		Other:           []error{pgErr("40001")},
		ChunkRows:       12001,
		ChunkStatements: 3,
		MaxArgs:         65535,
		// Large messages split an insert by size, so that one statement
		// stays far below the 1 GiB Postgres accepts in a protocol message.
		SizePayloads: []int{100 << 20, 100 << 20, 100 << 20, 100 << 20, 0},
		SizeRows:     []int{1, 1, 1, 2},
	})
}

type pgErr string

func (e pgErr) Error() string    { return "pg error " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

func TestNamesAreQuotedAndQualified(t *testing.T) {
	d := postgres.MustNew(postgres.Options{Schema: "app", OutboxTable: "events", Notify: true})
	if d.OutboxTable() != `"app"."events"` || d.InboxTable() != `"app"."millbox_inbox"` {
		t.Fatalf("names %s %s", d.OutboxTable(), d.InboxTable())
	}
	if d.NotifyChannel() != "millbox_app_events" {
		t.Fatalf("channel %q", d.NotifyChannel())
	}
	long := postgres.MustNew(postgres.Options{Schema: strings.Repeat("s", 40), OutboxTable: strings.Repeat("t", 40), Notify: true})
	if c := long.NotifyChannel(); len(c) > 63 {
		t.Fatalf("channel %q longer than 63 bytes", c)
	}
	if postgres.MustNew(postgres.Options{}).NotifyChannel() != "" {
		t.Fatal("notify is on by default")
	}
}

// TestInsertOutboxNotifiesOnce checks that of the statements one insert
// makes, only the last one notifies.
func TestInsertOutboxNotifiesOnce(t *testing.T) {
	qs := dialecttest.Builder(postgres.MustNew(postgres.Options{Notify: true})).InsertOutbox(make([]sqladapters.OutboxMessage, 12001))
	if len(qs) < 2 {
		t.Fatalf("%d statements, want several", len(qs))
	}
	for i, q := range qs {
		if notifies := strings.Contains(q.SQL, "pg_notify"); notifies != (i == len(qs)-1) {
			t.Fatalf("statement %d notify=%v; only the last one should notify", i, notifies)
		}
	}
}

// TestNewRefusesNameClashes checks that no inbox table name leads to a
// name the outbox's migrations create (its tables of dead letters, kept
// and scheduled messages, leases, members and migrations, its indexes and
// sequences, and on a partitioned outbox its partitions), nor an outbox
// table name to one of the inbox's indexes.
func TestNewRefusesNameClashes(t *testing.T) {
	for name, partitioned := range map[string]*postgres.PartitionOptions{"plain": nil, "partitioned": {}} {
		t.Run(name, func(t *testing.T) {
			dialecttest.CheckNameClashes(t, func(outbox, inbox string) (sqladapters.Dialect, error) {
				return postgres.New(postgres.Options{OutboxTable: outbox, InboxTable: inbox, Partitioned: partitioned})
			}, false)
		})
	}
}
