package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestDSNPasswordNeverPrinted gives every command a DSN of every form with
// a password, valid or not, reachable or not: the password shows nowhere
// in what the command prints, and a valid DSN of any form is understood.
func TestDSNPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "S3cretPW"
	for _, c := range []struct {
		dsn  string
		want string // in stderr
	}{
		// Valid forms; nothing listens on port 1.
		{"postgres://app:" + pw + "@127.0.0.1:1/test?connect_timeout=5", "PostgreSQL at 127.0.0.1:1/test"},
		{"postgresql://app:" + pw + "@127.0.0.1:1/test?sslmode=disable", "PostgreSQL at 127.0.0.1:1/test"},
		{"postgres://app@127.0.0.1:1/test?password=" + pw, "PostgreSQL at 127.0.0.1:1/test"},
		{"postgres://app:" + pw + "%21@127.0.0.1:1/test", "PostgreSQL at 127.0.0.1:1/test"},
		{"password=" + pw + " host=127.0.0.1 port=1 dbname=test", "PostgreSQL at 127.0.0.1:1/test"},
		{"host=127.0.0.1 port=1 user=app password='" + pw + " and more' dbname=test", "PostgreSQL at 127.0.0.1:1/test"},
		{"dbname=test password = " + pw + " host=127.0.0.1 port=1", "PostgreSQL at 127.0.0.1:1/test"},
		{"application_name=x sslpassword=" + pw + " host=127.0.0.1 port=1 dbname=test", "PostgreSQL at 127.0.0.1:1/test"},
		{"mysql://app:" + pw + "@tcp(127.0.0.1:1)/test", "MySQL at 127.0.0.1:1/test"},
		{"mysql://app:" + pw + "@127.0.0.1:1/test?timeout=5s", "MySQL at 127.0.0.1:1/test"},
		{"app:" + pw + "@tcp(127.0.0.1:1)/test", "MySQL at 127.0.0.1:1/test"},
		{"app:" + pw + "@with@tcp(127.0.0.1:1)/test", "MySQL at 127.0.0.1:1/test"},
		// Broken forms.
		{"postgres://app:" + pw + "@127.0.0.1:notaport/test", "bad --dsn"},
		{"postgres://app:" + pw + "@[::1/test", "bad --dsn"},
		{"password=" + pw + " port=abc host=x", "bad --dsn"},
		{"password='" + pw, "bad --dsn"},
		{"mysql://app:" + pw + "@[bad", "bad --dsn"},
		{"mysql://app:" + pw + "@127.0.0.1:1/test?timeout=never", "bad --dsn"},
		{"app:" + pw + "@tcp(127.0.0.1:1/test", "bad --dsn"},
		{"app:" + pw + "@nonsense", "bad --dsn"},
		{"redis://app:" + pw + "@127.0.0.1:1", "unknown scheme redis://"},
		{"app:" + pw + "@host://x", "bad --dsn"},
		{pw, "bad --dsn"},
	} {
		for _, args := range [][]string{{"status"}, {"dead", "list"}, {"migrate", "up"}, {"dead", "show", "1"}, {"migrate", "sql"}} {
			r := runCmd(t, append(args, "--dsn", c.dsn, "--connect-timeout", "5s")...)
			if strings.Contains(r.stdout+r.stderr, pw) || strings.Contains(r.stdout+r.stderr, "%21") {
				t.Fatalf("%v with --dsn %q printed the password:\n%s", args, c.dsn, r)
			}
			if args[0] == "status" && (r.code == exitOK || !strings.Contains(r.stderr, c.want)) {
				t.Fatalf("status with --dsn %q: want a failure saying %q:\n%s", c.dsn, c.want, r)
			}
		}
	}
}

// TestDSNPasswordFromEnvironmentNeverPrinted is the same for MILLBOX_DSN.
func TestDSNPasswordFromEnvironmentNeverPrinted(t *testing.T) {
	const pw = "S3cretPW"
	t.Setenv("MILLBOX_DSN", "password="+pw+" port=abc host=x")
	if r := runCmd(t, "status"); r.code != exitUsage || strings.Contains(r.stdout+r.stderr, pw) {
		t.Fatalf("status with a bad MILLBOX_DSN: %s", r)
	}
}

// TestHintsCarryTheFlags works on a schema of its own with a DSN that
// holds a password, as a newcomer would: every hint repeats --schema and
// the DSN, the password masked; every error names the schema it looked in
// and carries one "millbox:"; migrate up says what it created; and the
// hints, pasted with the password put back, work.
func TestHintsCarryTheFlags(t *testing.T) {
	t.Parallel()
	// The test server trusts local connections, so any password works.
	cfg, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	in := postgresInstallation(t)
	dsn := fmt.Sprintf("postgres://%s:Pa55word@%s:%d/%s?sslmode=disable", cfg.ConnConfig.User, cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
	schema := in.flags[1]
	cli := func(args ...string) []string { return append(args, "--schema", schema, "--dsn", dsn) }
	masked := strings.Replace(dsn, "Pa55word", "xxxxx", 1)
	// paste runs a hint as printed, the password put back.
	paste := func(hint string) result {
		t.Helper()
		hint = strings.TrimSuffix(hint, " (with your password for xxxxx)")
		args, err := shellWords(strings.TrimPrefix(strings.Replace(hint, "xxxxx", "Pa55word", 1), "millbox "))
		if err != nil {
			t.Fatalf("hint %q: %v", hint, err)
		}
		return runCmd(t, args...)
	}
	lineWith := func(out, prefix string) string {
		t.Helper()
		for _, l := range strings.Split(out, "\n") {
			if i := strings.Index(l, prefix); i >= 0 {
				return l[i+len(prefix):]
			}
		}
		t.Fatalf("no line with %q in\n%s", prefix, out)
		return ""
	}
	wantFlags := func(what, s string) {
		t.Helper()
		if !strings.Contains(s, "--schema "+schema) || !strings.Contains(s, "--dsn '"+masked+"'") || strings.Contains(s, "Pa55word") {
			t.Fatalf("%s does not carry --schema %s and the masked --dsn:\n%s", what, schema, s)
		}
	}

	r := runCmd(t, cli("status")...)
	if r.code != exitError || !strings.Contains(r.stderr, `in schema "`+schema+`" of postgres at`) || strings.Count(r.stderr, "millbox:") != 1 {
		t.Fatalf("status before migrating: want one error naming the schema:\n%s", r)
	}
	wantFlags("the missing tables' hint", lineWith(r.stderr, "create them with: "))
	if r := paste(lineWith(r.stderr, "create them with: ")); r.code != 0 || !strings.Contains(r.stdout, `created the millbox tables in schema "`+schema+`"`) ||
		!strings.Contains(r.stdout, "applied migrations 1 (outbox and leases)") {
		t.Fatalf("the pasted migrate up: %s", r)
	}
	if r := mustRun(t, cli("migrate", "up")...); !strings.Contains(r.stdout, "up to date in schema") {
		t.Fatalf("migrate up again: %s", r)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := in.dialect.InsertOutbox(ctx, in.db, []sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte("p"), Metadata: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	rows := pendingRows(t, ctx, in)
	if _, err := in.dialect.RecordFailure(ctx, in.db, sqladapters.Failure{ID: rows[0].ID, Attempts: 3, Error: "boom", Dead: true}); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, cli("status")...)
	hint := lineWith(r.stdout, "see them with: ")
	wantFlags("status's hint", hint)
	if r := paste(hint); r.code != 0 || !strings.Contains(r.stdout, "boom") {
		t.Fatalf("the pasted dead list: %s", r)
	}
	r = mustRun(t, cli("dead", "show", strconv.FormatInt(rows[0].ID, 10))...)
	hint = lineWith(r.stdout, "Send it again with: ")
	wantFlags("dead show's hint", hint)
	if r := paste(hint); r.code != 0 || !strings.Contains(r.stdout, "requeued 1 dead letter") {
		t.Fatalf("the pasted requeue: %s", r)
	}
	r = runCmd(t, cli("dead", "show", "999999")...)
	if r.code != exitError || strings.Count(r.stderr, "millbox:") != 1 || !strings.Contains(r.stderr, "millbox: no such dead letter: id 999999 in schema \""+schema+"\"") {
		t.Fatalf("dead show of a missing id: %s", r)
	}
	if _, err := in.dialect.RecordFailure(ctx, in.db, sqladapters.Failure{ID: rows[0].ID, Attempts: 3, Error: "boom", Dead: true}); err != nil {
		t.Fatal(err)
	}
	r = runCmd(t, cli("dead", "discard", "--topic", "t")...)
	hint = lineWith(r.stderr, "check them with: ")
	wantFlags("the refusal's hint", hint)
	if r := paste(strings.SplitN(hint, " (or add --dry-run)", 2)[0]); r.code != 0 || !strings.Contains(r.stdout, "boom") {
		t.Fatalf("the pasted dead list of the refusal: %s", r)
	}
}

// shellWords splits a command line as a POSIX shell does for the words
// hints write: plain words and single-quoted ones.
func shellWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			cur.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == ' ':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// TestControlCharactersEscaped prints dead letters whose topic, key, error,
// metadata and payload hold terminal escape sequences, a C1 control and a
// bidirectional override: no output of the text commands holds them raw.
func TestControlCharactersEscaped(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "hostile.db")
	raw, err := modernc.Open(path, modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ctx := context.Background()
	db, d := stdsql.WrapDB(raw), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	const hostile = "\x1b[2J\x1b]0;PWNED\x07\u009b31m\u202e"
	msg := sqladapters.OutboxMessage{Topic: "t" + hostile, UUID: "u" + hostile, Payload: []byte("payload " + hostile + "\nline two"),
		Metadata: []byte(`{"note":"` + strings.ReplaceAll(hostile, "\x1b", `\u001b`) + `"}`), Key: "k" + hostile, KeyHash: 1}
	if err := d.InsertOutbox(ctx, db, []sqladapters.OutboxMessage{msg}); err != nil {
		t.Fatal(err)
	}
	rows, err := d.ReadPending(ctx, db, sqladapters.PendingQuery{Limit: 1}, false)
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: rows[0].ID, Attempts: 3, Error: "error " + hostile + "\r\nand more", Dead: true}); err != nil {
		t.Fatal(err)
	}
	// A consumer and a forwarder instance with such names too.
	if _, err := d.RecordInbox(ctx, db, "c"+hostile, "m"); err != nil {
		t.Fatal(err)
	}
	if err := d.EnsurePartitions(ctx, db, 1); err != nil {
		t.Fatal(err)
	}
	if err := d.ClaimPartitions(ctx, db, "i"+hostile, time.Minute, 1); err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(rows[0].ID, 10)
	for _, args := range [][]string{{"dead", "list"}, {"dead", "list", "--group-by-error"}, {"dead", "show", id}, {"status"}} {
		r := mustRun(t, append(args, "--dsn", "sqlite://"+path)...)
		if strings.ContainsAny(r.stdout+r.stderr, "\x1b\x07\r\u009b\u202e") {
			t.Fatalf("%v prints control characters raw:\n%q", args, r.stdout)
		}
		if !strings.Contains(r.stdout, `\x1b[2J\x1b]0;PWNED\x07\u009b31m\u202e`) {
			t.Fatalf("%v does not show them escaped:\n%s", args, r.stdout)
		}
	}
	if r := mustRun(t, "dead", "show", id, "--dsn", "sqlite://"+path); !strings.Contains(r.stdout, "line two") || !strings.Contains(r.stdout, `and more`) {
		t.Fatalf("dead show loses the lines after the first:\n%s", r.stdout)
	}
}
