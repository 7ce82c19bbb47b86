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

func TestSQLiteNewDefaults(t *testing.T) {
	d, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d.OutboxTable() != `"millbox_outbox"` || d.InboxTable() != `"millbox_inbox"` {
		t.Fatalf("tables %s %s", d.OutboxTable(), d.InboxTable())
	}
	if d.Name() != "sqlite" || d.NotifyChannel() != "" {
		t.Fatalf("name %q channel %q", d.Name(), d.NotifyChannel())
	}
	want := sqladapters.Features{TransactionalDDL: true, ExcludeInSQL: true}
	if d.Features() != want {
		t.Fatalf("features %+v", d.Features())
	}
}

func TestSQLiteNewRejectsBadNames(t *testing.T) {
	long := strings.Repeat("a", MaxTableNameLength+1)
	cases := map[string]Options{
		"quote":            {OutboxTable: `x"; DROP TABLE y; --`},
		"space":            {OutboxTable: "my table"},
		"dot":              {OutboxTable: "main.outbox"},
		"leading digit":    {InboxTable: "1inbox"},
		"backtick":         {InboxTable: "in`box"},
		"bracket":          {InboxTable: "[inbox]"},
		"non-ASCII":        {OutboxTable: "outbóx"},
		"NUL":              {OutboxTable: "out\x00box"},
		"too long":         {OutboxTable: long},
		"reserved prefix":  {OutboxTable: "sqlite_outbox"},
		"reserved upper":   {InboxTable: "SQLITE_inbox"},
		"same name":        {OutboxTable: "events", InboxTable: "events"},
		"same name folded": {OutboxTable: "Events", InboxTable: "events"},
		"derived clash":    {OutboxTable: "events", InboxTable: "events_leases"},
		"index clash":      {OutboxTable: "events_received_idx", InboxTable: "events"},
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(opts)
			if !errors.Is(err, sqladapters.ErrInvalidName) {
				t.Fatalf("want ErrInvalidName, got %v", err)
			}
			if !strings.Contains(err.Error(), "sqlite.Options.") {
				t.Fatalf("error does not name the field: %v", err)
			}
		})
	}
	if _, err := New(Options{OutboxTable: strings.Repeat("a", MaxTableNameLength)}); err != nil {
		t.Fatalf("longest allowed name rejected: %v", err)
	}
}

func TestSQLiteMustNewPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	MustNew(Options{OutboxTable: "bad name"})
}

// TestSQLitePlaceholdersMatchArgs checks every statement binds exactly its
// arguments: no SQL text of the dialect contains a literal question mark.
func TestSQLitePlaceholdersMatchArgs(t *testing.T) {
	for name, q := range dialecttest.Statements(MustNew(Options{})) {
		if n := strings.Count(q.SQL, "?"); n != len(q.Args) {
			t.Errorf("%s: %d placeholders, %d args\n%s", name, n, len(q.Args), q.SQL)
		}
		if strings.Contains(q.SQL, "$") {
			t.Errorf("%s: Postgres-style placeholder\n%s", name, q.SQL)
		}
	}
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

func TestSQLiteInsertOutboxChunks(t *testing.T) {
	d := MustNew(Options{})
	msgs := make([]sqladapters.OutboxMessage, rowsPerInsert*2+1)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint(i), Metadata: []byte(`{}`)}
	}
	qs := d.InsertOutbox(msgs)
	if len(qs) != 3 {
		t.Fatalf("%d statements for %d messages", len(qs), len(msgs))
	}
	seen := 0
	for _, q := range qs {
		if len(q.Args) > 32766 {
			t.Fatalf("%d parameters exceed SQLite's limit", len(q.Args))
		}
		for i := 0; i < len(q.Args); i += 6 {
			if q.Args[i+1] != fmt.Sprint(seen) {
				t.Fatalf("message %d out of order: %v", seen, q.Args[i+1])
			}
			seen++
		}
	}
	if seen != len(msgs) {
		t.Fatalf("inserted %d of %d", seen, len(msgs))
	}
	if qs := d.InsertOutbox(nil); len(qs) != 0 {
		t.Fatalf("no messages built %d statements", len(qs))
	}
}

func TestSQLiteInsertOutboxValues(t *testing.T) {
	d := MustNew(Options{})
	q := d.InsertOutbox([]sqladapters.OutboxMessage{
		{Topic: "t", UUID: "a", Payload: nil, Metadata: []byte(`{"k":"v"}`), Key: "", KeyHash: 9},
		{Topic: "t", UUID: "b", Payload: []byte{0}, Metadata: nil, Key: "key", KeyHash: 1},
	})[0]
	if q.Args[2] == nil || len(q.Args[2].([]byte)) != 0 {
		t.Fatalf("nil payload bound as %#v, want an empty blob", q.Args[2])
	}
	if q.Args[3] != `{"k":"v"}` {
		t.Fatalf("metadata bound as %T, want text", q.Args[3])
	}
	if q.Args[9] != "{}" {
		t.Fatalf("missing metadata bound as %#v, want {}", q.Args[9])
	}
	if q.Args[4] != nil || q.Args[10] != "key" {
		t.Fatalf("keys bound as %#v %#v, want NULL and text", q.Args[4], q.Args[10])
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

func TestSQLiteRequeueAndPartitionListsKeepNilMeaning(t *testing.T) {
	d := MustNew(Options{})
	if q := d.RequeueDeadLetters(nil); strings.Contains(q.SQL, "json_each") {
		t.Fatalf("nil ids must requeue every dead row:\n%s", q.SQL)
	}
	if q := d.RequeueDeadLetters([]int64{}); q.Args[0] != "[]" {
		t.Fatalf("empty ids must requeue none: %v", q.Args)
	}
	if q := d.SelectPending(sqladapters.PendingQuery{Limit: 1}); strings.Contains(q.SQL, "key_hash %") {
		t.Fatalf("nil Owned must read every partition:\n%s", q.SQL)
	}
	if q := d.SelectPending(sqladapters.PendingQuery{Partitions: 4, Owned: []int{}, Limit: 1}); !strings.Contains(q.SQL, "key_hash %") || q.Args[2] != "[]" {
		t.Fatalf("empty Owned must read no partition: %v\n%s", q.Args, q.SQL)
	}
}

type codeErr struct {
	code int
	msg  string
}

func (e *codeErr) Error() string { return e.msg }
func (e *codeErr) Code() int     { return e.code }

func TestSQLiteClassifyError(t *testing.T) {
	d := MustNew(Options{})
	if d.ClassifyError(nil) != nil {
		t.Fatal("nil error classified")
	}
	dup := []error{
		&codeErr{2067, "constraint failed: UNIQUE constraint failed: t.x (2067)"},
		&codeErr{1555, "constraint failed: UNIQUE constraint failed: t.id (1555)"},
		&codeErr{19, "constraint failed: UNIQUE constraint failed: t.x (19)"},
		fmt.Errorf("exec: %w", &codeErr{2067, "UNIQUE constraint failed: t.x"}),
		errors.New("UNIQUE constraint failed: millbox_inbox.consumer, millbox_inbox.message_id"),
	}
	for _, err := range dup {
		got := d.ClassifyError(err)
		if !errors.Is(got, sqladapters.ErrDuplicate) || !errors.Is(got, err) {
			t.Errorf("%v: want ErrDuplicate wrapping it, got %v", err, got)
		}
	}
	missing := []error{
		&codeErr{1, `SQL logic error: no such table: main.millbox_outbox (1)`},
		errors.New("no such table: millbox_outbox"),
	}
	for _, err := range missing {
		got := d.ClassifyError(err)
		var mt *sqladapters.MissingTableError
		if !errors.As(got, &mt) || !errors.Is(got, sqladapters.ErrMissingTable) || mt.Dialect != "sqlite" || !errors.Is(got, err) {
			t.Errorf("%v: want *MissingTableError, got %v", err, got)
		}
	}
	other := []error{
		&codeErr{1299, "constraint failed: NOT NULL constraint failed: t.x (1299)"},
		&codeErr{5, "database is locked (5) (SQLITE_BUSY)"},
		// The code wins over text that merely mentions the phrase.
		&codeErr{275, "CHECK constraint failed: x <> 'UNIQUE constraint failed'"},
		errors.New("syntax error"),
	}
	for _, err := range other {
		if got := d.ClassifyError(err); got != err {
			t.Errorf("%v: changed to %v", err, got)
		}
	}
	// Classifying twice does not wrap twice.
	once := d.ClassifyError(dup[0])
	if d.ClassifyError(once) != once {
		t.Error("duplicate classified twice")
	}
	m := d.ClassifyError(missing[0])
	if d.ClassifyError(m) != m {
		t.Error("missing table classified twice")
	}
}
