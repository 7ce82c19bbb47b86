package mysql

import (
	"bytes"
	"errors"
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
	d, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d.OutboxTable() != "`millbox_outbox`" || d.InboxTable() != "`millbox_inbox`" {
		t.Fatalf("tables %s %s", d.OutboxTable(), d.InboxTable())
	}
	if d.Name() != "mysql" || d.NotifyChannel() != "" {
		t.Fatalf("name %q channel %q", d.Name(), d.NotifyChannel())
	}
	want := sqladapters.Features{ConcurrentWriters: true, ExcludeInSQL: true}
	if d.Features() != want {
		t.Fatalf("features %+v", d.Features())
	}
	if !MustNew(Options{SkipLocked: true}).Features().SkipLocked {
		t.Fatal("Options.SkipLocked not reported")
	}
	if d.opts.MigrationLockTimeout != DefaultMigrationLockTimeout || d.opts.MaxInsertBytes != DefaultMaxInsertBytes {
		t.Fatalf("defaults not applied: %+v", d.opts)
	}
	want2 := []string{"`millbox_outbox`", "`millbox_outbox_leases`", "`millbox_outbox_members`", "`millbox_inbox`", "`millbox_outbox_migrations`"}
	if got := d.Tables(); strings.Join(got, " ") != strings.Join(want2, " ") {
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
	if d.Database() != "app" {
		t.Fatalf("Database() = %q", d.Database())
	}
	for name, q := range dialecttest.Statements(d) {
		for _, tbl := range regexp.MustCompile("(?i)(?:FROM|INTO|UPDATE|TABLE(?: IF NOT EXISTS)?) +(`[^`]+`(?:\\.`[^`]+`)?)").FindAllStringSubmatch(q.SQL, -1) {
			if !strings.HasPrefix(tbl[1], "`app`.") {
				t.Fatalf("%s: unqualified table %s in\n%s", name, tbl[1], q.SQL)
			}
		}
	}
	qs := d.CreateMigrationsTable()
	if len(qs) != 2 || qs[0].SQL != "CREATE DATABASE IF NOT EXISTS `app` CHARACTER SET utf8mb4" {
		t.Fatalf("migrations table statements %+v", qs)
	}
	if len(MustNew(Options{}).CreateMigrationsTable()) != 1 {
		t.Fatal("creates a database without Options.Database")
	}
}

func TestMySQLNewRejectsBadOptions(t *testing.T) {
	long := strings.Repeat("a", MaxTableNameLength+1)
	cases := map[string]Options{
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
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(opts)
			if !errors.Is(err, sqladapters.ErrInvalidName) {
				t.Fatalf("want ErrInvalidName, got %v", err)
			}
			if !strings.Contains(err.Error(), "mysql.Options.") {
				t.Fatalf("error does not name the field: %v", err)
			}
		})
	}
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
	// The longest names are accepted, and every derived name fits MySQL's
	// 64 bytes.
	d, err := New(Options{
		Database:    strings.Repeat("d", MaxDatabaseNameLength),
		OutboxTable: strings.Repeat("o", MaxTableNameLength),
		InboxTable:  strings.Repeat("i", MaxTableNameLength),
	})
	if err != nil {
		t.Fatalf("longest allowed names rejected: %v", err)
	}
	for _, q := range d.Tables() {
		for _, part := range strings.Split(q, ".") {
			if n := len(strings.Trim(part, "`")); n > 64 {
				t.Fatalf("%s has a part of %d bytes", q, n)
			}
		}
	}
}

func TestMySQLMustNewPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	MustNew(Options{OutboxTable: "bad name"})
}

var stringLiteral = regexp.MustCompile(`'[^']*'`)

// TestMySQLPlaceholdersMatchArgs checks every statement: as many ? as
// arguments, no Postgres syntax, no empty IN list, names quoted.
func TestMySQLPlaceholdersMatchArgs(t *testing.T) {
	for _, opts := range []Options{{}, {SkipLocked: true, Database: "app"}} {
		d := MustNew(opts)
		for name, q := range dialecttest.Statements(d) {
			sql := stringLiteral.ReplaceAllString(q.SQL, "''")
			if n := strings.Count(sql, "?"); n != len(q.Args) {
				t.Errorf("%s: %d placeholders, %d args:\n%s", name, n, len(q.Args), q.SQL)
			}
			for _, bad := range []string{"$1", "::", "RETURNING", "ON CONFLICT", "now()", "IN ()", `"`} {
				if strings.Contains(sql, bad) {
					t.Errorf("%s contains %q:\n%s", name, bad, q.SQL)
				}
			}
			// key and partition are reserved words in MySQL.
			if regexp.MustCompile("[^`_]\\b(key|partition)\\b[^`_]").MatchString(strings.ReplaceAll(sql, "PRIMARY KEY", "")) &&
				!strings.Contains(name, "Migration") {
				t.Errorf("%s uses an unquoted reserved word:\n%s", name, q.SQL)
			}
		}
	}
}

func TestMySQLSelectPending(t *testing.T) {
	d := MustNew(Options{})
	all := d.SelectPending(sqladapters.PendingQuery{Limit: 5})
	if strings.Contains(all.SQL, "key_hash %") || len(all.Args) != 1 || all.Args[0] != 5 {
		t.Fatalf("no-partition query: %s %v", all.SQL, all.Args)
	}
	q := d.SelectPending(sqladapters.PendingQuery{Partitions: 16, Owned: []int{2, 5}, Limit: 7})
	for _, want := range []string{"o.key_hash % 16 IN (2,5)", "ORDER BY o.id LIMIT ?", "p.id < o.id", "p.next_attempt_at > UTC_TIMESTAMP(6)"} {
		if !strings.Contains(q.SQL, want) {
			t.Fatalf("missing %q in\n%s", want, q.SQL)
		}
	}
	none := d.SelectPending(sqladapters.PendingQuery{Partitions: 16, Owned: []int{}, Limit: 7})
	if !strings.Contains(none.SQL, "AND FALSE") {
		t.Fatalf("no owned partitions must read nothing:\n%s", none.SQL)
	}
}

func TestMySQLInsertOutboxChunks(t *testing.T) {
	d := MustNew(Options{})
	small := make([]sqladapters.OutboxMessage, 25000)
	for i := range small {
		small[i] = sqladapters.OutboxMessage{Topic: "t", UUID: fmt.Sprint(i), Payload: []byte("x"), Metadata: []byte("{}")}
	}
	qs := d.InsertOutbox(small)
	if len(qs) != 3 {
		t.Fatalf("%d statements for 25,000 rows, want 3", len(qs))
	}
	n := 0
	for _, q := range qs {
		if len(q.Args) > 65535 {
			t.Fatalf("%d placeholders", len(q.Args))
		}
		if q.Args[1] != fmt.Sprint(n) {
			t.Fatalf("statement starts at %v, want %d", q.Args[1], n)
		}
		n += len(q.Args) / 6
	}
	if n != len(small) {
		t.Fatalf("%d rows in statements, want %d", n, len(small))
	}

	// Large messages split by size; one over the budget goes alone.
	d = MustNew(Options{MaxInsertBytes: 1 << 20})
	big := func(size int) sqladapters.OutboxMessage {
		return sqladapters.OutboxMessage{Topic: "t", UUID: "u", Payload: bytes.Repeat([]byte{0}, size), Metadata: []byte("{}")}
	}
	msgs := []sqladapters.OutboxMessage{big(200 << 10), big(200 << 10), big(200 << 10), big(3 << 20), big(10), big(10)}
	var sizes []int
	for _, q := range d.InsertOutbox(msgs) {
		sizes = append(sizes, len(q.Args)/6)
	}
	if fmt.Sprint(sizes) != "[2 1 1 2]" {
		t.Fatalf("rows per statement %v, want [2 1 1 2]", sizes)
	}

	// nil payload becomes empty bytes, not NULL; an empty key is NULL.
	q := d.InsertOutbox([]sqladapters.OutboxMessage{{Topic: "t", UUID: "u"}})[0]
	if p, ok := q.Args[2].([]byte); !ok || p == nil {
		t.Fatalf("payload arg %#v", q.Args[2])
	}
	if q.Args[3] != "{}" || q.Args[4] != nil {
		t.Fatalf("metadata %#v key %#v", q.Args[3], q.Args[4])
	}
	if len(d.InsertOutbox(nil)) != 0 {
		t.Fatal("statements for no messages")
	}
}

func TestMySQLEnsurePartitionsChunks(t *testing.T) {
	d := MustNew(Options{})
	if len(d.EnsurePartitions(0)) != 0 {
		t.Fatal("statements for zero partitions")
	}
	qs := d.EnsurePartitions(2500)
	if len(qs) != 3 || !strings.HasSuffix(qs[2].SQL, "(2499)") || !strings.Contains(qs[1].SQL, "VALUES (1000),") {
		t.Fatalf("%d statements, last %.80s", len(qs), qs[len(qs)-1].SQL)
	}
}

func TestMySQLClaimPartitions(t *testing.T) {
	plain := MustNew(Options{}).ClaimPartitions("a", time.Second, 3)
	if strings.Contains(plain.SQL, "SKIP LOCKED") || !strings.Contains(plain.SQL, "ORDER BY `partition` LIMIT ?") {
		t.Fatalf("plain claim:\n%s", plain.SQL)
	}
	skip := MustNew(Options{SkipLocked: true}).ClaimPartitions("a", time.Second, 3)
	if !strings.Contains(skip.SQL, "FOR UPDATE SKIP LOCKED") {
		t.Fatalf("SkipLocked claim:\n%s", skip.SQL)
	}
	if fmt.Sprint(plain.Args) != "[a 1000000 3]" || fmt.Sprint(skip.Args) != "[3 a 1000000]" {
		t.Fatalf("args %v %v", plain.Args, skip.Args)
	}
}

func TestMySQLLockMigrations(t *testing.T) {
	for timeout, secs := range map[time.Duration]int64{0: 60, time.Millisecond: 1, 1500 * time.Millisecond: 2, time.Hour: 3600} {
		lock, unlock := MustNew(Options{MigrationLockTimeout: timeout}).LockMigrations()
		if got := lock.Args[len(lock.Args)-1]; got != secs {
			t.Fatalf("timeout %v: GET_LOCK waits %v s, want %d", timeout, got, secs)
		}
		if lock.Args[0] != nil || len(unlock.Args) != 2 || unlock.Args[0] != nil || unlock.Args[1] != DefaultOutboxTable {
			t.Fatalf("args %v %v", lock.Args, unlock.Args)
		}
	}
	lock, _ := MustNew(Options{Database: "app"}).LockMigrations()
	if lock.Args[0] != "app" {
		t.Fatalf("database arg %v", lock.Args[0])
	}
}

func TestMySQLMigrationSQL(t *testing.T) {
	script := sqladapters.MigrationSQL(MustNew(Options{}))
	if n := strings.Count(script, "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;"); n != 4 {
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
	q := MustNew(Options{}).InsertInbox(a, "m")
	if q.Args[0] != fitKey(a, maxConsumerBytes) || q.Args[1] != "m" {
		t.Fatalf("inbox args %q", q.Args)
	}
}

func TestMySQLRecordFailureCleansError(t *testing.T) {
	d := MustNew(Options{})
	q := d.RecordFailure(sqladapters.Failure{ID: 9, Attempts: 3, Error: "bad \xff byte", Backoff: 1500 * time.Millisecond})
	if q.Args[1] != "bad \uFFFD byte" || q.Args[2] != int64(1500000) || q.Args[3] != int64(9) {
		t.Fatalf("args %q", q.Args)
	}
	if !strings.Contains(q.SQL, "dead_at = NULL") {
		t.Fatalf("live failure:\n%s", q.SQL)
	}
	if q := d.RecordFailure(sqladapters.Failure{Dead: true}); !strings.Contains(q.SQL, "dead_at = UTC_TIMESTAMP(6)") {
		t.Fatalf("dead failure:\n%s", q.SQL)
	}
	long := strings.Repeat("é", maxErrorBytes) // two bytes each
	s := cleanText("x"+long, maxErrorBytes)
	if len(s) > maxErrorBytes || !utf8.ValidString(s) {
		t.Fatalf("cut to %d bytes, valid %v", len(s), utf8.ValidString(s))
	}
}

func TestMySQLDeleteInboxBeforeSendsUTC(t *testing.T) {
	at := time.Date(2024, 5, 1, 14, 0, 0, 123456000, time.FixedZone("CEST", 2*3600))
	q := MustNew(Options{}).DeleteInboxBefore(at, 50)
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
	if q := MustNew(Options{}).CompleteForwarded(nil, false); !strings.HasSuffix(q.SQL, "WHERE FALSE") {
		t.Fatal(q.SQL)
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

func TestMySQLClassifyError(t *testing.T) {
	d := MustNew(Options{})
	for _, n := range []uint16{1146, 1049} {
		err := d.ClassifyError(fmt.Errorf("wrapped: %w", &mysqldrv.MySQLError{Number: n, Message: "x"}))
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) || mt.Dialect != "mysql" {
			t.Fatalf("%d: %v", n, err)
		}
	}
	dup := &mysqldrv.MySQLError{Number: 1062, Message: "Duplicate entry"}
	if err := d.ClassifyError(dup); !errors.Is(err, sqladapters.ErrDuplicate) || !errors.Is(err, dup) {
		t.Fatalf("1062: %v", err)
	}
	other := &mysqldrv.MySQLError{Number: 1213}
	if err := d.ClassifyError(other); err != other {
		t.Fatalf("1213 changed: %v", err)
	}
	plain := errors.New("x")
	if d.ClassifyError(plain) != plain || d.ClassifyError(nil) != nil {
		t.Fatal("non-MySQL errors must pass unchanged")
	}
}

// A message of MaxMessageBytes fits MaxAllowedPacket even when escaping
// doubles every byte, and MaxInsertBytes follows a small packet down.
func TestMySQLMessageLimitFitsThePacket(t *testing.T) {
	for _, packet := range []int{MinMaxAllowedPacket, 4 << 20, DefaultMaxAllowedPacket, 64 << 20} {
		d := MustNew(Options{MaxAllowedPacket: packet})
		m := sqladapters.OutboxMessage{Topic: "t", UUID: "u", Metadata: []byte("{}")}
		m.Payload = make([]byte, d.MaxMessageBytes()-len(m.Topic)-len(m.UUID)-len(m.Metadata))
		q := d.InsertOutbox([]sqladapters.OutboxMessage{m})[0]
		if size := len(q.SQL) + 2*(len(m.Topic)+len(m.UUID)+len(m.Payload)+len(m.Metadata)) + 64; size > packet {
			t.Fatalf("packet %d: a message of MaxMessageBytes %d makes a statement of up to %d bytes", packet, d.MaxMessageBytes(), size)
		}
		if d.opts.MaxInsertBytes > packet-packetReserve {
			t.Fatalf("packet %d: MaxInsertBytes %d leaves no room for the statement", packet, d.opts.MaxInsertBytes)
		}
	}
	if got := MustNew(Options{}).MaxMessageBytes(); got != (DefaultMaxAllowedPacket-packetReserve)/2 {
		t.Fatalf("default MaxMessageBytes %d", got)
	}
}
