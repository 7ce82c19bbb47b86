package sqlite

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
)

// TestSQLiteDialect runs the checks every dialect shares.
func TestSQLiteDialect(t *testing.T) {
	dialecttest.Exercise(t, dialecttest.Spec[Options]{
		Name:     "sqlite",
		New:      func(o Options) (sqladapters.Dialect, error) { return New(o) },
		MustNew:  func(o Options) sqladapters.Dialect { return MustNew(o) },
		Outbox:   `"millbox_outbox"`,
		Inbox:    `"millbox_inbox"`,
		Features: sqladapters.Features{TransactionalDDL: true, ExcludeInSQL: true, HighWaterMark: true},
		BadNames: map[string]Options{
			"quote":            {OutboxTable: `x"; DROP TABLE y; --`},
			"space":            {OutboxTable: "my table"},
			"dot":              {OutboxTable: "main.outbox"},
			"leading digit":    {InboxTable: "1inbox"},
			"backtick":         {InboxTable: "in`box"},
			"bracket":          {InboxTable: "[inbox]"},
			"non-ASCII":        {OutboxTable: "outbóx"},
			"NUL":              {OutboxTable: "out\x00box"},
			"too long":         {OutboxTable: strings.Repeat("a", MaxTableNameLength+1)},
			"reserved prefix":  {OutboxTable: "sqlite_outbox"},
			"reserved upper":   {InboxTable: "SQLITE_inbox"},
			"same name":        {OutboxTable: "events", InboxTable: "events"},
			"same name folded": {OutboxTable: "Events", InboxTable: "events"},
			"derived clash":    {OutboxTable: "events", InboxTable: "events_leases"},
			"index clash":      {OutboxTable: "events_received_idx", InboxTable: "events"},
		},
		Longest: Options{OutboxTable: strings.Repeat("a", MaxTableNameLength)},
		// No SQL text of the dialect contains a literal question mark.
		Statements:  []Options{{}},
		Placeholder: dialecttest.QuestionMark,
		Forbidden:   []string{"$"},
		Quote:       '"',
		Qualified:   Options{OutboxTable: "Ev_Out", InboxTable: "ev_in"},
		Qualifier:   `"`,
		Duplicate: []error{
			&codeErr{2067, "constraint failed: UNIQUE constraint failed: t.x (2067)"},
			&codeErr{1555, "constraint failed: UNIQUE constraint failed: t.id (1555)"},
			&codeErr{19, "constraint failed: UNIQUE constraint failed: t.x (19)"},
			fmt.Errorf("exec: %w", &codeErr{2067, "UNIQUE constraint failed: t.x"}),
			errors.New("UNIQUE constraint failed: millbox_inbox.consumer, millbox_inbox.message_id"),
		},
		Missing: []error{
			&codeErr{1, `SQL logic error: no such table: main.millbox_outbox (1)`},
			errors.New("no such table: millbox_outbox"),
		},
		Other: []error{
			&codeErr{1299, "constraint failed: NOT NULL constraint failed: t.x (1299)"},
			&codeErr{5, "database is locked (5) (SQLITE_BUSY)"},
			// The code wins over text that merely mentions the phrase.
			&codeErr{275, "CHECK constraint failed: x <> 'UNIQUE constraint failed'"},
			errors.New("syntax error"),
		},
		ChunkRows:       rowsPerInsert*2 + 1,
		ChunkStatements: 3,
		MaxArgs:         32766,
		EmptyValues:     true,
	})
}

func TestSQLiteNamesAreQuotedEverywhere(t *testing.T) {
	d := MustNew(Options{OutboxTable: "Ev_Out", InboxTable: "ev_in"})
	for name, q := range dialecttest.Statements(d) {
		for _, ident := range []string{"Ev_Out", "ev_in"} {
			for i := strings.Index(q.SQL, ident); i >= 0; {
				if i == 0 || q.SQL[i-1] != '"' {
					t.Errorf("%s: %s not quoted at %d\n%s", name, ident, i, q.SQL)
					break
				}
				j := strings.Index(q.SQL[i+1:], ident)
				if j < 0 {
					break
				}
				i += 1 + j
			}
		}
	}
	if s := sqladapters.MigrationSQL(d); !strings.Contains(s, `"Ev_Out_pending_idx" ON "Ev_Out"`) || !strings.Contains(s, `"ev_in_received_idx"`) {
		t.Fatalf("index names:\n%s", s)
	}
}

func TestSQLiteOffset(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                   "+0.000000 seconds",
		1500 * time.Millisecond:             "+1.500000 seconds",
		time.Microsecond:                    "+0.000001 seconds",
		-2 * time.Second:                    "-2.000000 seconds",
		36 * time.Hour:                      "+129600.000000 seconds",
		time.Nanosecond:                     "+0.000000 seconds",
		-250 * time.Millisecond:             "-0.250000 seconds",
		90*time.Second + 5*time.Microsecond: "+90.000005 seconds",
	} {
		if got := offset(d); got != want {
			t.Errorf("offset(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSQLiteFormatTime(t *testing.T) {
	at := time.Date(2024, 5, 1, 14, 3, 4, 567_890_000, time.FixedZone("CEST", 2*3600))
	if got := formatTime(at); got != "2024-05-01T12:03:04.567Z" {
		t.Fatalf("formatTime = %q", got)
	}
	if len(formatTime(time.Unix(0, 0))) != len(TimeLayout) {
		t.Fatal("width varies")
	}
}

func TestSQLiteIDList(t *testing.T) {
	if got := idList([]int64{3, -1, 9007199254740993}); got != "[3,-1,9007199254740993]" {
		t.Fatalf("idList = %s", got)
	}
	if got := idList([]int{}); got != "[]" {
		t.Fatalf("empty idList = %s", got)
	}
}

type codeErr struct {
	code int
	msg  string
}

func (e *codeErr) Error() string { return e.msg }
func (e *codeErr) Code() int     { return e.code }

// TestSQLiteNewRefusesNameClashes checks that no inbox table name leads to
// a name the outbox's migrations create (tables and indexes share one
// namespace), nor an outbox table name to one of the inbox's indexes,
// whatever their case.
func TestSQLiteNewRefusesNameClashes(t *testing.T) {
	dialecttest.CheckNameClashes(t, func(outbox, inbox string) (sqladapters.Dialect, error) {
		return New(Options{OutboxTable: outbox, InboxTable: inbox})
	}, true)
}
