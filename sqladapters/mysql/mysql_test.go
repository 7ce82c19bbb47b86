package mysql

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
)

func TestMySQLNewDefaults(t *testing.T) {
	d := MustNew(Options{})
	if !MustNew(Options{SkipLocked: true}).Features().SkipLocked {
		t.Fatal("Options.SkipLocked not reported")
	}
	if o := d.Options(); o.MigrationLockTimeout != DefaultMigrationLockTimeout || o.MaxInsertBytes != DefaultMaxInsertBytes {
		t.Fatalf("defaults not applied: %+v", o)
	}
	want := []string{"`millbox_outbox`", "`millbox_outbox_leases`", "`millbox_outbox_members`", "`millbox_inbox`", "`millbox_outbox_migrations`",
		"`millbox_outbox_dead`", "`millbox_outbox_kept`", "`millbox_outbox_retries`", "`millbox_outbox_scheduled`"}
	if got := d.Tables(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("tables %v", got)
	}
}

func TestMySQLDatabaseQualifiesEveryName(t *testing.T) {
	d := MustNew(Options{Database: "app", OutboxTable: "events", InboxTable: "seen"})
	for _, name := range d.Tables() {
		if !strings.HasPrefix(name, "`app`.`") {
			t.Fatalf("%s is not qualified", name)
		}
	}
	if d.Options().Database != "app" {
		t.Fatalf("Options().Database = %q", d.Options().Database)
	}
	qs := d.sql.CreateMigrationsTable()
	if len(qs) != 2 || qs[0].SQL != "CREATE DATABASE IF NOT EXISTS `app` CHARACTER SET utf8mb4" {
		t.Fatalf("migrations table statements %+v", qs)
	}
	if len(MustNew(Options{}).sql.CreateMigrationsTable()) != 1 {
		t.Fatal("creates a database without Options.Database")
	}
}

func TestMySQLNewRejectsBadOptions(t *testing.T) {
	for name, opts := range map[string]Options{
		"negative lock timeout": {MigrationLockTimeout: -time.Second},
		"negative insert bytes": {MaxInsertBytes: -1},
		"tiny packet":           {MaxAllowedPacket: 100},
		"insert over packet":    {MaxAllowedPacket: 4 << 20, MaxInsertBytes: 4 << 20},
	} {
		if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "mysql.Options.") {
			t.Fatalf("%s: want an error naming the field, got %v", name, err)
		}
	}
	// Every name derived from the longest ones fits MySQL's 64 bytes.
	for _, q := range MustNew(longest).Tables() {
		for _, part := range strings.Split(q, ".") {
			if n := len(strings.Trim(part, "`")); n > 64 {
				t.Fatalf("%s has a part of %d bytes", q, n)
			}
		}
	}
}

// longest has the longest names New accepts.
var longest = Options{
	Database:    strings.Repeat("d", MaxDatabaseNameLength),
	OutboxTable: strings.Repeat("o", MaxTableNameLength),
	InboxTable:  strings.Repeat("i", MaxTableNameLength),
}

// TestMySQLDialect runs the checks every dialect shares.
func TestMySQLDialect(t *testing.T) {
	long := strings.Repeat("a", MaxTableNameLength+1)
	dialecttest.Exercise(t, dialecttest.Spec[Options]{
		Name:     "mysql",
		New:      func(o Options) (sqladapters.Dialect, error) { return New(o) },
		MustNew:  func(o Options) sqladapters.Dialect { return MustNew(o) },
		Outbox:   "`millbox_outbox`",
		Inbox:    "`millbox_inbox`",
		Features: sqladapters.Features{ConcurrentWriters: true, ExcludeInSQL: true, HighWaterMark: true},
		BadNames: map[string]Options{
			"quote":            {OutboxTable: `x"; DROP TABLE y; --`},
			"backtick":         {InboxTable: "in`box"},
			"backtick escape":  {OutboxTable: "a` (x int); DROP TABLE t; -- "},
			"space":            {OutboxTable: "my table"},
			"dot":              {OutboxTable: "db.outbox"},
			"leading digit":    {InboxTable: "1inbox"},
			"non-ASCII":        {OutboxTable: "outbóx"},
			"NUL":              {OutboxTable: "out\x00box"},
			"newline":          {InboxTable: "in\nbox"},
			"too long":         {OutboxTable: long},
			"inbox too long":   {InboxTable: long},
			"bad database":     {Database: "app`; DROP DATABASE x; --"},
			"database dot":     {Database: "a.b"},
			"database long":    {Database: strings.Repeat("d", MaxDatabaseNameLength+1)},
			"same name":        {OutboxTable: "events", InboxTable: "events"},
			"same name folded": {OutboxTable: "Events", InboxTable: "events"},
			"derived clash":    {OutboxTable: "events", InboxTable: "events_leases"},
			"derived folded":   {OutboxTable: "events", InboxTable: "EVENTS_MIGRATIONS"},
			"members clash":    {OutboxTable: "events", InboxTable: "events_members"},
		},
		Longest:     longest,
		Statements:  []Options{{}, {SkipLocked: true, Database: "app"}},
		Placeholder: dialecttest.QuestionMark,
		Forbidden:   []string{"$1", "::", "RETURNING", "ON CONFLICT", "now()", "IN ()", `"`},
		Quote:       '`',
		Qualified:   Options{Database: "app", OutboxTable: "events", InboxTable: "seen"},
		Qualifier:   "`app`.",
		Duplicate:   []error{&mysqldrv.MySQLError{Number: 1062, Message: "Duplicate entry"}},
		Missing: []error{
			fmt.Errorf("wrapped: %w", &mysqldrv.MySQLError{Number: 1146, Message: "x"}),
			fmt.Errorf("wrapped: %w", &mysqldrv.MySQLError{Number: 1049, Message: "x"}),
		},
		Other:           []error{&mysqldrv.MySQLError{Number: 1213}},
		ChunkRows:       25000,
		ChunkStatements: 3,
		MaxArgs:         65535,
		SizeOptions:     Options{MaxInsertBytes: 1 << 20},
		SizePayloads:    []int{200 << 10, 200 << 10, 200 << 10, 3 << 20, 10, 10},
		SizeRows:        []int{2, 1, 1, 2},
		EmptyValues:     true,
	})
}

// TestMySQLReservedWordsQuoted checks that no statement uses key or
// partition, reserved words in MySQL, unquoted.
func TestMySQLReservedWordsQuoted(t *testing.T) {
	reserved := regexp.MustCompile("[^`_]\\b(key|partition)\\b[^`_]")
	for _, opts := range []Options{{}, {SkipLocked: true, Database: "app"}} {
		for name, q := range dialecttest.Statements(MustNew(opts)) {
			if reserved.MatchString(strings.ReplaceAll(q.SQL, "PRIMARY KEY", "")) && !strings.Contains(name, "Migration") {
				t.Errorf("%s uses an unquoted reserved word:\n%s", name, q.SQL)
			}
		}
	}
}

func TestMySQLEnsurePartitionsChunks(t *testing.T) {
	d := MustNew(Options{}).sql
	if len(d.EnsurePartitions(0)) != 0 {
		t.Fatal("statements for zero partitions")
	}
	qs := d.EnsurePartitions(2500)
	if len(qs) != 3 || !strings.HasSuffix(qs[2].SQL, "(2499)") || !strings.Contains(qs[1].SQL, "VALUES (1000),") {
		t.Fatalf("%d statements, last %.80s", len(qs), qs[len(qs)-1].SQL)
	}
}

func TestMySQLClaimPartitions(t *testing.T) {
	plain := MustNew(Options{}).sql.ClaimPartitions("a", time.Second, 3)
	if strings.Contains(plain.SQL, "SKIP LOCKED") || !strings.Contains(plain.SQL, "ORDER BY `partition` LIMIT ?") {
		t.Fatalf("plain claim:\n%s", plain.SQL)
	}
	skip := MustNew(Options{SkipLocked: true}).sql.ClaimPartitions("a", time.Second, 3)
	if !strings.Contains(skip.SQL, "FOR UPDATE SKIP LOCKED") {
		t.Fatalf("SkipLocked claim:\n%s", skip.SQL)
	}
	if fmt.Sprint(plain.Args) != "[a 1000000 3]" || fmt.Sprint(skip.Args) != "[3 a 1000000]" {
		t.Fatalf("args %v %v", plain.Args, skip.Args)
	}
}

func TestMySQLLockMigrations(t *testing.T) {
	for timeout, secs := range map[time.Duration]int64{0: 60, time.Millisecond: 1, 1500 * time.Millisecond: 2, time.Hour: 3600} {
		lock, unlock := MustNew(Options{MigrationLockTimeout: timeout}).sql.LockMigrations()
		if got := lock.Args[len(lock.Args)-1]; got != secs {
			t.Fatalf("timeout %v: GET_LOCK waits %v s, want %d", timeout, got, secs)
		}
		if lock.Args[0] != nil || len(unlock.Args) != 2 || unlock.Args[0] != nil || unlock.Args[1] != DefaultOutboxTable {
			t.Fatalf("args %v %v", lock.Args, unlock.Args)
		}
	}
	lock, _ := MustNew(Options{Database: "app"}).sql.LockMigrations()
	if lock.Args[0] != "app" {
		t.Fatalf("database arg %v", lock.Args[0])
	}
}

func TestMySQLMigrationSQL(t *testing.T) {
	script := sqladapters.MigrationSQL(MustNew(Options{}))
	if n := strings.Count(script, "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;"); n != 8 {
		t.Fatalf("%d InnoDB utf8mb4 tables in\n%s", n, script)
	}
	for _, want := range []string{"payload         LONGBLOB", "metadata        LONGTEXT", "DATETIME(6)", "PRIMARY KEY (consumer, message_id)", "KEY received_idx (received_at)"} {
		if !strings.Contains(script, want) {
			t.Fatalf("script lacks %q", want)
		}
	}
	if strings.Contains(script, "CREATE INDEX") {
		t.Fatal("CREATE INDEX is not idempotent on MySQL")
	}
}

func TestMySQLFitKey(t *testing.T) {
	if fitKey("abc", 3) != "abc" {
		t.Fatal("short key changed")
	}
	a, b := strings.Repeat("x", 600), strings.Repeat("x", 599)+"y"
	fa, fb := fitKey(a, maxMessageIDBytes), fitKey(b, maxMessageIDBytes)
	if fa == fb || len(fa) > maxMessageIDBytes || fa[0] != 0 || fa != fitKey(a, maxMessageIDBytes) {
		t.Fatalf("digests %q %q", fa, fb)
	}
	q := MustNew(Options{}).sql.InsertInbox(a, "m")
	if q.Args[0] != fitKey(a, maxConsumerBytes) || q.Args[1] != "m" {
		t.Fatalf("inbox args %q", q.Args)
	}
}

func TestMySQLRecordFailureCleansError(t *testing.T) {
	d := MustNew(Options{}).sql
	qs := d.RecordFailure(sqladapters.Failure{ID: 9, Attempts: 3, Error: "bad \xff byte", Backoff: 1500 * time.Millisecond})
	q := qs[0]
	fp := sqladapters.FingerprintError("bad \uFFFD byte")
	if q.Args[1] != "bad \uFFFD byte" || string(q.Args[2].([]byte)) != string(fp[:]) || q.Args[3] != int64(1500000) || q.Args[4] != int64(9) {
		t.Fatalf("args %q: the cleaned error, its fingerprint, the backoff and the id", q.Args)
	}
	if !strings.HasPrefix(q.SQL, "UPDATE "+d.outbox) || len(qs) != 3 || !strings.HasPrefix(qs[2].SQL, "INSERT INTO "+d.retries) {
		t.Fatalf("live failure: the update and the retry marker:\n%v", qs)
	}
	dead := d.RecordFailure(sqladapters.Failure{ID: 9, Attempts: 3, Error: "bad \xff byte", Dead: true})
	if len(dead) != 3 || !strings.HasPrefix(dead[0].SQL, "INSERT INTO "+d.dead) || dead[0].Args[1] != "bad \uFFFD byte" ||
		!strings.HasPrefix(dead[2].SQL, "DELETE FROM "+d.outbox) {
		t.Fatalf("dead failure: the copy into the dead letters and the delete:\n%v", dead)
	}
	long := strings.Repeat("é", maxErrorBytes) // two bytes each
	s := cleanText("x"+long, maxErrorBytes)
	if len(s) > maxErrorBytes || !utf8.ValidString(s) {
		t.Fatalf("cut to %d bytes, valid %v", len(s), utf8.ValidString(s))
	}
}

func TestMySQLDeleteInboxBeforeSendsUTC(t *testing.T) {
	at := time.Date(2024, 5, 1, 14, 0, 0, 123456000, time.FixedZone("CEST", 2*3600))
	q := MustNew(Options{}).sql.DeleteInboxBefore(at, 50)
	if q.Args[0] != "2024-05-01 12:00:00.123456" || q.Args[1] != 50 {
		t.Fatalf("args %v", q.Args)
	}
}

func TestMySQLIntLists(t *testing.T) {
	if got := idIn("id", []int64{}); got != "FALSE" {
		t.Fatal(got)
	}
	if got := idIn("id", []int64{-1, 0, 9223372036854775807}); got != "id IN (-1,0,9223372036854775807)" {
		t.Fatal(got)
	}
	if qs := MustNew(Options{}).sql.CompleteForwarded(nil, false); !strings.HasSuffix(qs[0].SQL, "WHERE FALSE") {
		t.Fatal(qs[0].SQL)
	}
}

func TestMySQLSkipLockedIn(t *testing.T) {
	cases := map[string]bool{
		"8.0.36":                    true,
		"8.0.1":                     true,
		"8.0.0-dmr":                 false,
		"8.4.0-commercial":          true,
		"9.1.0":                     true,
		"5.7.44-log":                false,
		"5.7.44-48-log":             false,
		"10.11.6-MariaDB-0+deb12u1": true,
		"10.6.0-MariaDB":            true,
		"10.5.23-MariaDB-log":       false,
		"5.5.5-10.6.12-MariaDB":     true,
		"5.5.5-10.4.1-MariaDB":      false,
		"11.4.2-MariaDB":            true,
		"8.0.11-TiDB-v7.5.0":        false,
	}
	for v, want := range cases {
		got, err := skipLockedIn(v)
		if err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "garbage", "x.y.z"} {
		if _, err := skipLockedIn(v); err == nil {
			t.Errorf("%q parsed", v)
		}
	}
}

// A message of MaxMessageBytes fits MaxAllowedPacket even when escaping
// doubles every byte, and MaxInsertBytes follows a small packet down.
func TestMySQLMessageLimitFitsThePacket(t *testing.T) {
	for _, packet := range []int{MinMaxAllowedPacket, 4 << 20, DefaultMaxAllowedPacket, 64 << 20} {
		d := MustNew(Options{MaxAllowedPacket: packet})
		m := sqladapters.OutboxMessage{Topic: "t", UUID: "u", Metadata: []byte("{}")}
		m.Payload = make([]byte, d.MaxMessageBytes()-len(m.Topic)-len(m.UUID)-len(m.Metadata))
		q := d.sql.InsertOutbox([]sqladapters.OutboxMessage{m})[0]
		if size := len(q.SQL) + 2*(len(m.Topic)+len(m.UUID)+len(m.Payload)+len(m.Metadata)) + 64; size > packet {
			t.Fatalf("packet %d: a message of MaxMessageBytes %d makes a statement of up to %d bytes", packet, d.MaxMessageBytes(), size)
		}
		if d.sql.opts.MaxInsertBytes > packet-packetReserve {
			t.Fatalf("packet %d: MaxInsertBytes %d leaves no room for the statement", packet, d.sql.opts.MaxInsertBytes)
		}
	}
	if got := MustNew(Options{}).MaxMessageBytes(); got != (DefaultMaxAllowedPacket-packetReserve)/2 {
		t.Fatalf("default MaxMessageBytes %d", got)
	}
}

// TestMySQLNewRefusesNameClashes checks that no inbox table name, in any
// case, leads to a table the outbox's migrations create.
func TestMySQLNewRefusesNameClashes(t *testing.T) {
	dialecttest.CheckNameClashes(t, func(outbox, inbox string) (sqladapters.Dialect, error) {
		return New(Options{OutboxTable: outbox, InboxTable: inbox})
	}, true)
}
