package dialecttest

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters"
)

// Placeholder is how a dialect marks the arguments of a statement.
type Placeholder int

const (
	// QuestionMark binds arguments in order to each ?.
	QuestionMark Placeholder = iota
	// Dollar binds argument n to $n.
	Dollar
)

// Spec describes one dialect to Exercise: how to build it, what it must
// report, and where the databases honestly differ. O is the dialect's
// Options type.
type Spec[O any] struct {
	// Name is what Dialect.Name returns, and the package whose Options
	// fields errors name ("sqlite.Options.OutboxTable").
	Name    string
	New     func(O) (sqladapters.Dialect, error)
	MustNew func(O) sqladapters.Dialect

	// Outbox, Inbox and Features are what the default options report.
	Outbox, Inbox string
	Features      sqladapters.Features

	// BadNames are options New rejects with ErrInvalidName and MustNew
	// panics on; Longest has the longest names New accepts.
	BadNames map[string]O
	Longest  O

	// Statements are the options whose statements are checked: each binds
	// exactly its arguments with Placeholder and contains none of
	// Forbidden (another database's syntax).
	Statements  []O
	Placeholder Placeholder
	Forbidden   []string
	// Every table the statements of Qualified name, quoted with Quote,
	// starts with Qualifier: the schema or database when the options set
	// one.
	Qualified O
	Quote     byte
	Qualifier string

	// Duplicate, Missing and Other are driver errors ClassifyError maps to
	// ErrDuplicate, to a *MissingTableError, and leaves alone. Classifying
	// a classified error again returns it unchanged.
	Duplicate, Missing, Other []error

	// ChunkRows messages of InsertOutbox make ChunkStatements statements of
	// at most MaxArgs arguments.
	ChunkRows, ChunkStatements, MaxArgs int
	// With SizeOptions, messages with payloads of SizePayloads bytes are
	// inserted SizeRows rows a statement.
	SizeOptions  O
	SizePayloads []int
	SizeRows     []int
	// EmptyValues is true when a nil payload binds as an empty blob,
	// missing metadata as {} and an empty key as NULL, in column order
	// topic, uuid, payload, metadata, key, key hash.
	EmptyValues bool
}

// Exercise runs the checks every dialect shares, one subtest each.
func Exercise[O any](t *testing.T, s Spec[O]) {
	t.Run("Defaults", func(t *testing.T) { s.defaults(t) })
	t.Run("RejectsBadNames", func(t *testing.T) { s.rejectsBadNames(t) })
	t.Run("MustNewPanics", func(t *testing.T) { s.mustNewPanics(t) })
	t.Run("Placeholders", func(t *testing.T) { s.placeholders(t) })
	t.Run("Qualified", func(t *testing.T) { s.qualified(t) })
	t.Run("ClassifyError", func(t *testing.T) { s.classifyError(t) })
	t.Run("InsertOutboxChunks", func(t *testing.T) { s.insertOutboxChunks(t) })
	if s.SizePayloads != nil {
		t.Run("InsertOutboxBySize", func(t *testing.T) { s.insertOutboxBySize(t) })
	}
	if s.EmptyValues {
		t.Run("InsertOutboxValues", func(t *testing.T) { s.insertOutboxValues(t) })
	}
}

func (s Spec[O]) defaults(t *testing.T) {
	var zero O
	d, err := s.New(zero)
	if err != nil {
		t.Fatal(err)
	}
	if d.OutboxTable() != s.Outbox || d.InboxTable() != s.Inbox {
		t.Fatalf("tables %s %s", d.OutboxTable(), d.InboxTable())
	}
	if d.Name() != s.Name || d.NotifyChannel() != "" {
		t.Fatalf("name %q channel %q", d.Name(), d.NotifyChannel())
	}
	if d.Features() != s.Features {
		t.Fatalf("features %+v", d.Features())
	}
}

func (s Spec[O]) rejectsBadNames(t *testing.T) {
	for name, opts := range s.BadNames {
		t.Run(name, func(t *testing.T) {
			_, err := s.New(opts)
			if !errors.Is(err, sqladapters.ErrInvalidName) {
				t.Fatalf("want ErrInvalidName, got %v", err)
			}
			if !strings.Contains(err.Error(), s.Name+".Options.") {
				t.Fatalf("error does not name the field: %v", err)
			}
		})
	}
	if _, err := s.New(s.Longest); err != nil {
		t.Fatalf("longest allowed names rejected: %v", err)
	}
}

func (s Spec[O]) mustNewPanics(t *testing.T) {
	for name, opts := range s.BadNames {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			s.MustNew(opts)
		}()
	}
}

var (
	stringLiteral = regexp.MustCompile(`'[^']*'`)
	dollar        = regexp.MustCompile(`\$(\d+)`)
)

func (s Spec[O]) placeholders(t *testing.T) {
	for _, opts := range s.Statements {
		for name, q := range Statements(s.MustNew(opts)) {
			switch s.Placeholder {
			case QuestionMark:
				for _, sql := range []string{q.SQL, stringLiteral.ReplaceAllString(q.SQL, "''")} {
					if n := strings.Count(sql, "?"); n != len(q.Args) {
						t.Errorf("%s: %d placeholders, %d args\n%s", name, n, len(q.Args), q.SQL)
					}
				}
			case Dollar:
				seen := map[int]bool{}
				for _, m := range dollar.FindAllStringSubmatch(q.SQL, -1) {
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
			}
			for _, bad := range s.Forbidden {
				if strings.Contains(q.SQL, bad) {
					t.Errorf("%s contains %q:\n%s", name, bad, q.SQL)
				}
			}
		}
	}
}

func (s Spec[O]) qualified(t *testing.T) {
	q := regexp.QuoteMeta(string(s.Quote))
	name := q + `[^` + q + `]+` + q
	table := regexp.MustCompile(`(?i)\b(?:FROM|INTO|UPDATE|JOIN|TABLE(?: IF NOT EXISTS)?|ON) +(` + name + `(?:\.` + name + `)?)`)
	for stmt, q := range Statements(s.MustNew(s.Qualified)) {
		for _, m := range table.FindAllStringSubmatch(q.SQL, -1) {
			if !strings.HasPrefix(m[1], s.Qualifier) {
				t.Errorf("%s: table %s outside %s:\n%s", stmt, m[1], s.Qualifier, q.SQL)
			}
		}
	}
}

func (s Spec[O]) classifyError(t *testing.T) {
	var zero O
	d := s.MustNew(zero)
	if d.ClassifyError(nil) != nil {
		t.Fatal("nil error classified")
	}
	for _, err := range s.Duplicate {
		got := d.ClassifyError(err)
		if !errors.Is(got, sqladapters.ErrDuplicate) || !errors.Is(got, err) {
			t.Errorf("%v: want ErrDuplicate wrapping it, got %v", err, got)
		}
		if d.ClassifyError(got) != got {
			t.Errorf("%v: classified twice", err)
		}
	}
	for _, err := range s.Missing {
		got := d.ClassifyError(err)
		var mt *sqladapters.MissingTableError
		if !errors.As(got, &mt) || !errors.Is(got, sqladapters.ErrMissingTable) || mt.Dialect != s.Name || !errors.Is(got, err) {
			t.Errorf("%v: want *MissingTableError, got %v", err, got)
		}
		if !strings.Contains(got.Error(), "sqladapters.Migrate") {
			t.Errorf("%v: the error does not say how to create the tables: %v", err, got)
		}
		if d.ClassifyError(got) != got {
			t.Errorf("%v: classified twice", err)
		}
	}
	for _, err := range append(slices.Clip(s.Other), errors.New("x")) {
		if got := d.ClassifyError(err); got != err {
			t.Errorf("%v: changed to %v", err, got)
		}
	}
}

func (s Spec[O]) insertOutboxChunks(t *testing.T) {
	var zero O
	d := Builder(s.MustNew(zero))
	msgs := make([]sqladapters.OutboxMessage, s.ChunkRows)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint(i), Payload: []byte("x"), Metadata: []byte(`{}`)}
	}
	qs := d.InsertOutbox(msgs)
	if len(qs) != s.ChunkStatements {
		t.Fatalf("%d statements for %d messages, want %d", len(qs), len(msgs), s.ChunkStatements)
	}
	seen := 0
	for _, q := range qs {
		if len(q.Args) > s.MaxArgs {
			t.Fatalf("%d parameters exceed the limit of %d", len(q.Args), s.MaxArgs)
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

// insertOutboxBySize checks that large messages split an insert by size,
// and that one over the budget goes alone.
func (s Spec[O]) insertOutboxBySize(t *testing.T) {
	d := Builder(s.MustNew(s.SizeOptions))
	payloads := map[int][]byte{}
	var msgs []sqladapters.OutboxMessage
	for _, size := range s.SizePayloads {
		if payloads[size] == nil {
			payloads[size] = make([]byte, size)
		}
		msgs = append(msgs, sqladapters.OutboxMessage{Topic: "t", UUID: "u", Payload: payloads[size], Metadata: []byte("{}")})
	}
	var rows []int
	for _, q := range d.InsertOutbox(msgs) {
		rows = append(rows, len(q.Args)/6)
	}
	if !slices.Equal(rows, s.SizeRows) {
		t.Fatalf("rows per statement %v, want %v", rows, s.SizeRows)
	}
}

func (s Spec[O]) insertOutboxValues(t *testing.T) {
	var zero O
	q := Builder(s.MustNew(zero)).InsertOutbox([]sqladapters.OutboxMessage{
		{Topic: "t", UUID: "a", Payload: nil, Metadata: []byte(`{"k":"v"}`), Key: "", KeyHash: 9},
		{Topic: "t", UUID: "b", Payload: []byte{0}, Metadata: nil, Key: "key", KeyHash: 1},
	})[0]
	if p, ok := q.Args[2].([]byte); !ok || p == nil || len(p) != 0 {
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
