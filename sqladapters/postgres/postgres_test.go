package postgres_test

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestNewRejectsHostileNames(t *testing.T) {
	for _, o := range []postgres.Options{
		{Schema: `public"; DROP SCHEMA public; --`},
		{OutboxTable: "outbox x"},
		{InboxTable: `inbox"`},
		{OutboxTable: strings.Repeat("a", postgres.MaxTableNameLength+1)},
		{OutboxTable: "same", InboxTable: "same"},
	} {
		if _, err := postgres.New(o); !errors.Is(err, sqladapters.ErrInvalidName) {
			t.Fatalf("%+v accepted: %v", o, err)
		}
	}
}

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

func TestInsertOutboxChunksUnderTheParameterLimit(t *testing.T) {
	d := postgres.MustNew(postgres.Options{Notify: true})
	msgs := make([]sqladapters.OutboxMessage, 12001)
	qs := d.InsertOutbox(msgs)
	if len(qs) != 3 {
		t.Fatalf("%d statements, want 3", len(qs))
	}
	total := 0
	for i, q := range qs {
		if len(q.Args) > 65535 {
			t.Fatalf("statement %d has %d parameters", i, len(q.Args))
		}
		notifies := strings.Contains(q.SQL, "pg_notify")
		if notifies != (i == len(qs)-1) {
			t.Fatalf("statement %d notify=%v; only the last one should notify", i, notifies)
		}
		total += len(q.Args) / 6
	}
	if total != len(msgs) {
		t.Fatalf("%d rows inserted, want %d", total, len(msgs))
	}
}

func TestClassifyError(t *testing.T) {
	d := postgres.MustNew(postgres.Options{})
	if err := d.ClassifyError(pgErr("42P01")); !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "Migrate") {
		t.Fatalf("undefined table: %v", err)
	}
	if err := d.ClassifyError(pgErr("23505")); !errors.Is(err, sqladapters.ErrDuplicate) {
		t.Fatalf("unique violation: %v", err)
	}
	other := pgErr("40001")
	if err := d.ClassifyError(other); err != other {
		t.Fatalf("other error changed: %v", err)
	}
}

type pgErr string

func (e pgErr) Error() string    { return "pg error " + string(e) }
func (e pgErr) SQLState() string { return string(e) }

// TestEveryStatementBindsItsArgsAndQualifiesItsTables checks each statement
// the dialect builds: its placeholders are exactly $1..$n for n arguments,
// and every table it names is quoted and in the configured schema.
func TestEveryStatementBindsItsArgsAndQualifiesItsTables(t *testing.T) {
	d := postgres.MustNew(postgres.Options{Schema: "app", OutboxTable: "events", Notify: true})
	placeholder := regexp.MustCompile(`\$(\d+)`)
	table := regexp.MustCompile(`(?i)\b(?:FROM|INTO|UPDATE|JOIN|TABLE(?: IF NOT EXISTS)?|ON) +("[^"]+"(?:\."[^"]+")?)`)
	for name, q := range dialecttest.Statements(d) {
		seen := map[int]bool{}
		for _, m := range placeholder.FindAllStringSubmatch(q.SQL, -1) {
			n, _ := strconv.Atoi(m[1])
			seen[n] = true
		}
		if len(seen) != len(q.Args) {
			t.Errorf("%s: %d distinct placeholders, %d args:\n%s", name, len(seen), len(q.Args), q.SQL)
		}
		for i := 1; i <= len(q.Args); i++ {
			if !seen[i] {
				t.Errorf("%s: $%d unused:\n%s", name, i, q.SQL)
			}
		}
		for _, m := range table.FindAllStringSubmatch(q.SQL, -1) {
			if !strings.HasPrefix(m[1], `"app".`) {
				t.Errorf("%s: table %s outside the schema:\n%s", name, m[1], q.SQL)
			}
		}
	}
}

// Large messages split an insert by size, so that one statement stays far
// below the 1 GiB Postgres accepts in a protocol message.
func TestInsertOutboxChunksLargeMessagesBySize(t *testing.T) {
	d := postgres.MustNew(postgres.Options{})
	big := sqladapters.OutboxMessage{Topic: "t", UUID: "u", Payload: make([]byte, 100<<20)}
	var rows []int
	for _, q := range d.InsertOutbox([]sqladapters.OutboxMessage{big, big, big, big, {Topic: "t", UUID: "v"}}) {
		rows = append(rows, len(q.Args)/6)
	}
	if fmt.Sprint(rows) != "[1 1 1 2]" {
		t.Fatalf("rows per statement %v, want [1 1 1 2]", rows)
	}
}
