package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestMain checks that no command leaves a goroutine behind: every run
// closes the connections it opened.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The databases the tests use, with the defaults of the other millbox
// tests.
func postgresURL() string {
	return envOr("MILLBOX_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable")
}

func mysqlDSN() string {
	return envOr("MILLBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true")
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// unavailable fails the test in CI and skips it elsewhere.
func unavailable(t *testing.T, service string, err error) {
	t.Helper()
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatalf("%s is required in CI but unreachable: %v", service, err)
	}
	t.Skipf("%s unreachable (%v); start it or set its environment variable", service, err)
}

func uniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// result is one run of the command.
type result struct {
	code           int
	stdout, stderr string
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// mustRun runs the command and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := runCmd(t, args...)
	if r.code != 0 {
		t.Fatalf("millbox %s: %s", strings.Join(args, " "), r)
	}
	return r
}

func runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	r := mustRun(t, append(args, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		t.Fatalf("millbox %s: %v\n%s", strings.Join(args, " "), err, r)
	}
}

// installation is a fresh, not yet migrated, set of millbox tables.
type installation struct {
	dsn     string   // what the command gets
	flags   []string // --schema or table flags
	db      sqladapters.DB
	dialect sqladapters.Dialect
	// concurrentMigrate says whether several migrators may start on a
	// fresh database at once (not a fresh SQLite file: switching it to WAL
	// takes a lock SQLite does not wait for).
	concurrentMigrate bool
}

func postgresInstallation(t *testing.T) installation {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, postgresURL())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	schema := uniqueName("mbcli_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	d := postgres.MustNew(postgres.Options{Schema: schema})
	return installation{dsn: postgresURL(), flags: []string{"--schema", schema}, db: pgxv5.WrapPool(pool), dialect: d, concurrentMigrate: true}
}

func mysqlInstallation(t *testing.T) installation {
	db, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		t.Fatalf("MILLBOX_MYSQL_DSN: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		unavailable(t, "MySQL/MariaDB", err)
	}
	outbox := uniqueName("mbcli_")
	d := mysql.MustNew(mysql.Options{OutboxTable: outbox, InboxTable: outbox + "_in"})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range d.Tables() {
			if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
				t.Logf("drop table %s: %v", table, err)
			}
		}
		db.Close()
	})
	return installation{
		dsn:               mysqlDSN(),
		flags:             []string{"--outbox-table", outbox, "--inbox-table", outbox + "_in"},
		db:                stdsql.WrapDB(db),
		dialect:           d,
		concurrentMigrate: true,
	}
}

func sqliteInstallation(t *testing.T) installation {
	path := filepath.Join(t.TempDir(), "app.db")
	db, err := modernc.Open(path, modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return installation{dsn: "sqlite://" + path, db: stdsql.WrapDB(db), dialect: sqlite.MustNew(sqlite.Options{})}
}

func TestPostgres(t *testing.T) { t.Parallel(); exercise(t, postgresInstallation(t)) }
func TestMySQL(t *testing.T)    { t.Parallel(); exercise(t, mysqlInstallation(t)) }
func TestSQLite(t *testing.T)   { t.Parallel(); exercise(t, sqliteInstallation(t)) }

// jsonStatus and friends are decoded from the command's output.
type statusOut = jsonStatus

type deadOut = jsonDeadLetter

// exercise runs every command against one installation, as an operator
// would: migrate, publish, see, dead-letter, filter, requeue, deliver,
// prune.
func exercise(t *testing.T, in installation) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cli := func(args ...string) []string {
		return append(append(args, "--dsn", in.dsn), in.flags...)
	}

	// Before migrating, every command says how to create the tables.
	for _, args := range [][]string{{"status"}, {"dead", "list"}, {"dead", "requeue", "1"}, {"prune", "--inbox-older-than", "1d"}} {
		r := runCmd(t, cli(args...)...)
		if r.code != exitError || !strings.Contains(r.stderr, "millbox migrate up") || !strings.Contains(r.stderr, "millbox migrate sql") {
			t.Fatalf("%v on missing tables: want exit 1 saying to run millbox migrate up or migrate sql, got %s", args, r)
		}
	}

	// migrate up: several at once, then again.
	if in.concurrentMigrate {
		var wg sync.WaitGroup
		results := make([]result, 3)
		for i := range results {
			wg.Go(func() { results[i] = runCmd(t, cli("migrate", "up")...) })
		}
		wg.Wait()
		for _, r := range results {
			if r.code != 0 {
				t.Fatalf("concurrent migrate up: %s", r)
			}
		}
	} else {
		mustRun(t, cli("migrate", "up")...)
	}
	if r := mustRun(t, cli("migrate", "up")...); !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("second migrate up: %s", r)
	}

	// Publish in a transaction, as an application does.
	type msg struct{ topic, uuid, key, payload string }
	published := []msg{
		{"orders", "o-1", "k1", `{"order":1}`},
		{"orders", "o-2", "k2", `{"order":2}`},
		{"orders", "o-3", "k1", `{"order":3}`},
		{"payments", "p-1", "k3", `{"payment":1}`},
		{"payments", "p-2", "", `{"payment":2}`},
	}
	publish := func(msgs ...msg) {
		t.Helper()
		tx, err := in.db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: in.dialect})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			wm := message.NewMessage(m.uuid, []byte(m.payload))
			if m.key != "" {
				wm.Metadata.Set(forwarder.DefaultKeyMetadataField, m.key)
			}
			if err := pub.Publish(m.topic, wm); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish(published...)
	// A delayed message waits in the scheduled table.
	{
		tx, err := in.db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: in.dialect})
		if err != nil {
			t.Fatal(err)
		}
		later := message.NewMessage("p-later", []byte(`{"payment":3}`))
		forwarder.DeliverAfter(later, time.Hour)
		if err := pub.Publish("payments", later); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	inboxRecord := func(consumer, id string) {
		t.Helper()
		if _, err := in.dialect.RecordInbox(ctx, in.db, consumer, id); err != nil {
			t.Fatal(err)
		}
	}
	inboxRecord("billing", "m-1")
	inboxRecord("billing", "m-2")
	inboxRecord("shipping", "m-1")

	var st statusOut
	runJSON(t, &st, cli("status")...)
	if st.Pending != 5 || st.DeadLetters != 0 || st.ForwardedKept != 0 || st.InboxRecords != 3 || st.OldestPendingAgeSeconds < 0 {
		t.Fatalf("status after publishing 5 rows and 3 inbox records: %+v", st)
	}
	wantTopics := []jsonTopic{{Topic: "orders", Pending: 3}, {Topic: "payments", Pending: 2}}
	if len(st.Topics) != 2 || st.Topics[0].Topic != "orders" || st.Topics[0].Pending != 3 || st.Topics[1].Topic != "payments" || st.Topics[1].Pending != 2 {
		t.Fatalf("topics: got %+v, want %+v", st.Topics, wantTopics)
	}
	if len(st.Consumers) != 2 || st.Consumers[0].Consumer != "billing" || st.Consumers[0].Records != 2 || st.Consumers[1].Records != 1 {
		t.Fatalf("consumers: %+v", st.Consumers)
	}
	if st.Scheduled != 1 || st.NextDue == nil || st.NextDue.Before(time.Now()) || st.Topics[1].Scheduled != 1 || st.Topics[0].Scheduled != 0 {
		t.Fatalf("scheduled messages in the status: %+v", st)
	}
	if r := mustRun(t, cli("status")...); !strings.Contains(r.stdout, "orders") || !strings.Contains(r.stdout, "payments") || !strings.Contains(r.stdout, "billing") ||
		!strings.Contains(r.stdout, "SCHEDULED") || !strings.Contains(r.stdout, "Next scheduled message due") {
		t.Fatalf("human status:\n%s", r)
	}

	// Dead letters, made the way the forwarder makes them.
	ids := map[string]int64{}
	for _, row := range pendingRows(t, ctx, in) {
		ids[row.UUID] = row.ID
	}
	kill := func(uuid, errText string) {
		t.Helper()
		if n, err := in.dialect.RecordFailure(ctx, in.db, sqladapters.Failure{ID: ids[uuid], Attempts: 10, Error: errText, Dead: true}); err != nil || n != 1 {
			t.Fatalf("record failure of %s: %d rows, %v", uuid, n, err)
		}
	}
	kill("o-1", "kafka: broker down: connection refused")
	kill("o-3", "schema invalid: field order")
	kill("p-1", "kafka: broker down: connection refused")

	listIDs := func(args ...string) []int64 {
		t.Helper()
		var dls []deadOut
		runJSON(t, &dls, cli(append([]string{"dead", "list"}, args...)...)...)
		var got []int64
		for _, dl := range dls {
			got = append(got, dl.ID)
		}
		return got
	}
	for _, c := range []struct {
		args []string
		want []int64
	}{
		{nil, []int64{ids["o-1"], ids["o-3"], ids["p-1"]}},
		{[]string{"--topic", "orders"}, []int64{ids["o-1"], ids["o-3"]}},
		{[]string{"--key", "k1"}, []int64{ids["o-1"], ids["o-3"]}},
		{[]string{"--key", "k3", "--topic", "payments"}, []int64{ids["p-1"]}},
		{[]string{"--error", "connection refused"}, []int64{ids["o-1"], ids["p-1"]}},
		{[]string{"--error", "Connection Refused"}, nil},
		{[]string{"--error", "schema", "--topic", "payments"}, nil},
		{[]string{"--newer-than", "1h"}, []int64{ids["o-1"], ids["o-3"], ids["p-1"]}},
		{[]string{"--older-than", "1d"}, nil},
		{[]string{"--limit", "1", "--after", strconv.FormatInt(ids["o-1"], 10)}, []int64{ids["o-3"]}},
	} {
		if got := listIDs(c.args...); !slices.Equal(got, c.want) {
			t.Fatalf("dead list %v: got ids %v, want %v (ids by uuid %v)", c.args, got, c.want, ids)
		}
	}
	var groups []jsonGroup
	runJSON(t, &groups, cli("dead", "list", "--group-by-error")...)
	if len(groups) != 2 || groups[0].Count != 2 || groups[0].Error != "kafka: broker down: connection refused" ||
		groups[0].SampleID != ids["o-1"] || groups[1].Count != 1 || groups[1].SampleID != ids["o-3"] {
		t.Fatalf("groups: %+v", groups)
	}
	if r := mustRun(t, cli("dead", "list", "--group-by-error")...); !strings.Contains(r.stdout, "connection refused") {
		t.Fatalf("human groups:\n%s", r)
	}
	if r := mustRun(t, cli("dead", "list", "--topic", "orders")...); !strings.Contains(r.stdout, "schema invalid") {
		t.Fatalf("human list:\n%s", r)
	}
	var shown deadOut
	runJSON(t, &shown, cli("dead", "show", strconv.FormatInt(ids["o-3"], 10))...)
	if shown.UUID != "o-3" || shown.Topic != "orders" || shown.Key != "k1" || shown.LastError != "schema invalid: field order" ||
		shown.Payload == nil || *shown.Payload != `{"order":3}` || shown.Attempts != 10 {
		t.Fatalf("dead show: %+v", shown)
	}
	if r := mustRun(t, cli("dead", "show", strconv.FormatInt(ids["o-3"], 10))...); !strings.Contains(r.stdout, `{"order":3}`) || !strings.Contains(r.stdout, "millbox dead requeue") {
		t.Fatalf("human show:\n%s", r)
	}
	if r := runCmd(t, cli("dead", "show", strconv.FormatInt(ids["o-2"], 10))...); r.code != exitError || !strings.Contains(r.stderr, "no such dead letter") {
		t.Fatalf("show of a pending row: %s", r)
	}

	// Changes by filter need --yes, and --dry-run changes nothing.
	deadCount := func() int64 {
		t.Helper()
		var st statusOut
		runJSON(t, &st, cli("status")...)
		return st.DeadLetters
	}
	for _, args := range [][]string{
		{"dead", "discard", "--error", "schema"},
		{"dead", "discard", strconv.FormatInt(ids["o-3"], 10)},
		{"dead", "requeue", "--topic", "orders"},
		{"dead", "requeue", "--all"},
		{"dead", "discard", "--all"},
	} {
		r := runCmd(t, cli(args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--yes") {
			t.Fatalf("%v without --yes: want exit 2 asking for --yes, got %s", args, r)
		}
	}
	// Every dead letter is said with --all, alone: an empty filter, as a
	// script whose variable came out empty gives, changes nothing.
	for _, args := range [][]string{
		{"dead", "requeue", "--yes"},
		{"dead", "discard", "--yes"},
		{"dead", "discard", "--error", "", "--yes"},
		{"dead", "requeue", "--dry-run"},
		{"dead", "discard", "--all", "--topic", "orders", "--yes"},
		{"dead", "requeue", "--all", strconv.FormatInt(ids["o-1"], 10)},
	} {
		r := runCmd(t, cli(args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "--all") {
			t.Fatalf("%v: want exit 2 naming --all, got %s", args, r)
		}
	}
	if r := mustRun(t, cli("dead", "requeue", "--error", "refused", "--dry-run")...); !strings.Contains(r.stdout, "would requeue 2 dead letters") {
		t.Fatalf("dry run: %s", r)
	}
	if r := mustRun(t, cli("dead", "discard", "--all", "--dry-run")...); !strings.Contains(r.stdout, "would discard 3 dead letters") {
		t.Fatalf("dry run: %s", r)
	}
	if n := deadCount(); n != 3 {
		t.Fatalf("refused and dry-run changes changed rows: %d dead letters, want 3", n)
	}

	if r := mustRun(t, cli("dead", "discard", "--error", "schema", "--yes")...); !strings.Contains(r.stdout, "discarded 1 dead letter\n") {
		t.Fatalf("discard: %s", r)
	}
	// Requeue of a named id needs no --yes; by filter it does.
	if r := mustRun(t, cli("dead", "requeue", strconv.FormatInt(ids["o-1"], 10))...); !strings.Contains(r.stdout, "requeued 1 dead letter\n") {
		t.Fatalf("requeue by id: %s", r)
	}
	if r := mustRun(t, cli("dead", "requeue", "--error", "refused", "--yes", "--batch", "1")...); !strings.Contains(r.stdout, "requeued 1 dead letter\n") {
		t.Fatalf("requeue by filter: %s", r)
	}
	runJSON(t, &st, cli("status")...)
	if st.Pending != 4 || st.DeadLetters != 0 {
		t.Fatalf("after discarding 1 and requeueing 2 of 3 dead letters: %+v", st)
	}

	// The requeued rows are delivered by a forwarder.
	rec := newRecorder()
	instance := uniqueName("cli-test-")
	fwd, err := forwarder.New(forwarder.Config{
		DB:                  in.db,
		Dialect:             in.dialect,
		Destination:         rec,
		DelayedPollInterval: 20 * time.Millisecond,
		KeepForwarded:       true,
		Source:              forwarder.Polling{PollInterval: 20 * time.Millisecond, InstanceID: instance, Partitions: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	fctx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(fctx) }()
	want := []string{"o-1", "o-2", "p-1", "p-2"}
	select {
	case <-rec.waitFor(want...):
	case err := <-runErr:
		t.Fatalf("forwarder stopped: %v", err)
	case <-ctx.Done():
		t.Fatalf("delivered %v, want %v", rec.uuids(), want)
	}
	// While it runs, status names the instance holding the partitions.
	var owners []jsonOwner
	for owners == nil {
		if ctx.Err() != nil {
			t.Fatal("no partition owner while a forwarder runs")
		}
		runJSON(t, &st, cli("status")...)
		if len(st.Owners) > 0 {
			owners = st.Owners
		}
	}
	if len(owners) != 1 || owners[0].Instance != instance || len(st.Partitions) != 4 {
		t.Fatalf("partition owners while one forwarder runs: %+v, partitions %+v", owners, st.Partitions)
	}
	if err := fwd.Close(); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}
	if got := rec.uuids(); slices.Contains(got, "o-3") {
		t.Fatalf("the discarded dead letter was delivered: %v", got)
	}
	runJSON(t, &st, cli("status")...)
	if st.Pending != 0 || st.DeadLetters != 0 || st.ForwardedKept != 4 {
		t.Fatalf("after forwarding with KeepForwarded: %+v", st)
	}

	// Prune deletes forwarded rows and inbox records older than the ages,
	// and never a pending or dead row.
	time.Sleep(1500 * time.Millisecond) // let the rows age past the 1s cut-off
	publish(msg{"orders", "o-4", "k1", `{"order":4}`}, msg{"orders", "o-5", "k4", `{"order":5}`})
	for _, row := range pendingRows(t, ctx, in) {
		ids[row.UUID] = row.ID
	}
	kill("o-5", "too large")
	inboxRecord("billing", "m-3")
	if r := mustRun(t, cli("prune", "--forwarded-older-than", "1s", "--inbox-older-than", "1s", "--dry-run")...); !strings.Contains(r.stdout, "would delete 4 forwarded rows") || !strings.Contains(r.stdout, "would delete 3 inbox records") {
		t.Fatalf("prune dry run: %s", r)
	}
	r := mustRun(t, cli("prune", "--forwarded-older-than", "1s", "--inbox-older-than", "1s", "--batch", "3")...)
	if !strings.Contains(r.stdout, "deleted 4 forwarded rows") || !strings.Contains(r.stdout, "deleted 3 inbox records") ||
		!strings.Contains(r.stderr, "forwarded [####################] 100% 4/4 done") || !strings.Contains(r.stderr, "inbox     [####################] 100% 3/3 done") {
		t.Fatalf("prune: %s", r)
	}
	runJSON(t, &st, cli("status")...)
	if st.Pending != 1 || st.DeadLetters != 1 || st.ForwardedKept != 0 || st.InboxRecords != 1 {
		t.Fatalf("after prune: %+v", st)
	}
	if got := listIDs(); !slices.Equal(got, []int64{ids["o-5"]}) {
		t.Fatalf("dead letters after prune: %v", got)
	}

	// A dead letter that holds its key: status counts it, dead held lists
	// the key with the messages waiting behind it, until it is requeued.
	publish(msg{"orders", "h-1", "kh", `{"held":1}`}, msg{"orders", "h-2", "kh", `{"held":2}`}, msg{"orders", "h-3", "kh", `{"held":3}`})
	for _, row := range pendingRows(t, ctx, in) {
		ids[row.UUID] = row.ID
	}
	if n, err := in.dialect.RecordFailure(ctx, in.db, sqladapters.Failure{ID: ids["h-1"], Attempts: 10, Error: "refused", Dead: true, Hold: true}); err != nil || n != 1 {
		t.Fatalf("record failure of h-1: %d rows, %v", n, err)
	}
	var held []jsonHeldKey
	runJSON(t, &held, cli("dead", "held")...)
	if want := []jsonHeldKey{{Key: "kh", DeadLetterID: ids["h-1"], Held: 2}}; !slices.Equal(held, want) {
		t.Fatalf("dead held: %+v, want %+v", held, want)
	}
	if r := mustRun(t, cli("dead", "held")...); !strings.Contains(r.stdout, "kh") || !strings.Contains(r.stdout, "millbox dead requeue "+strconv.FormatInt(ids["h-1"], 10)) {
		t.Fatalf("human dead held:\n%s", r)
	}
	runJSON(t, &st, cli("status")...)
	if st.HeldKeys != 1 || st.DeadLetters != 2 {
		t.Fatalf("status with a held key: %+v", st)
	}
	if r := mustRun(t, cli("status")...); !strings.Contains(r.stdout, "1 key held by dead letters") || !strings.Contains(r.stdout, "millbox dead held") {
		t.Fatalf("human status with a held key:\n%s", r)
	}
	runJSON(t, &shown, cli("dead", "show", strconv.FormatInt(ids["h-1"], 10))...)
	if !shown.HoldsKey {
		t.Fatalf("dead show of a dead letter holding its key: %+v", shown)
	}
	if r := mustRun(t, cli("dead", "show", strconv.FormatInt(ids["h-1"], 10))...); !strings.Contains(r.stdout, "holds key:") {
		t.Fatalf("human dead show of a dead letter holding its key:\n%s", r)
	}
	mustRun(t, cli("dead", "requeue", strconv.FormatInt(ids["h-1"], 10))...)
	if r := mustRun(t, cli("dead", "held")...); !strings.Contains(r.stdout, "no keys are held") {
		t.Fatalf("dead held after the requeue:\n%s", r)
	}
	if r := runCmd(t, cli("dead", "held", "--topic", "orders")...); r.code != exitUsage {
		t.Fatalf("dead held with a filter: want exit 2, got %s", r)
	}
}

// pendingRows reads the pending rows through the dialect.
func pendingRows(t *testing.T, ctx context.Context, in installation) []sqladapters.OutboxRow {
	t.Helper()
	rows, err := in.dialect.ReadPending(ctx, in.db, sqladapters.PendingQuery{Limit: 100}, false)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// recorder is a destination publisher that keeps what it was given.
type recorder struct {
	mu      sync.Mutex
	got     []string
	waiters []waiter
}

type waiter struct {
	want []string
	ch   chan struct{}
}

func newRecorder() *recorder { return &recorder{} }

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.got = append(r.got, m.UUID)
	}
	r.wake()
	return nil
}

func (r *recorder) Close() error { return nil }

// waitFor returns a channel closed once every uuid was published.
func (r *recorder) waitFor(uuids ...string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := waiter{want: uuids, ch: make(chan struct{})}
	r.waiters = append(r.waiters, w)
	r.wake()
	return w.ch
}

func (r *recorder) wake() {
	kept := r.waiters[:0]
	for _, w := range r.waiters {
		all := true
		for _, u := range w.want {
			all = all && slices.Contains(r.got, u)
		}
		if all {
			close(w.ch)
		} else {
			kept = append(kept, w)
		}
	}
	r.waiters = kept
}

func (r *recorder) uuids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestMySQLURLForm reaches MySQL through the mysql:// forms of --dsn.
func TestMySQLURLForm(t *testing.T) {
	t.Parallel()
	in := mysqlInstallation(t)
	cfg, err := mysqldrv.ParseDSN(mysqlDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ParseTime = false // the command turns it on itself
	forms := []string{"mysql://" + cfg.FormatDSN()}
	if cfg.Net == "tcp" && cfg.Passwd == "" {
		forms = append(forms, "mysql://"+cfg.User+"@"+cfg.Addr+"/"+cfg.DBName)
	}
	for _, dsn := range forms {
		mustRun(t, append([]string{"migrate", "up", "--dsn", dsn}, in.flags...)...)
		var st statusOut
		runJSON(t, &st, append([]string{"status", "--dsn", dsn}, in.flags...)...)
		if st.Database != "mysql" || st.Pending != 0 {
			t.Fatalf("status through %s: %+v", dsn, st)
		}
	}
}

func TestBadDSN(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{"", "nonsense", "redis://localhost:6379", "sqlite://", "postgres://host:notaport/db", "mysql://"} {
		args := []string{"status"}
		if dsn != "" {
			args = append(args, "--dsn", dsn)
		}
		r := runCmd(t, args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "accepted forms") || !strings.Contains(r.stderr, "postgres://") ||
			!strings.Contains(r.stderr, "tcp(host:3306)") || !strings.Contains(r.stderr, "sqlite://") {
			t.Fatalf("--dsn %q: want exit 2 listing the accepted forms, got %s", dsn, r)
		}
	}
}

func TestDSNFromEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "env.db")
	t.Setenv("MILLBOX_DSN", "file:"+path)
	if r := mustRun(t, "migrate", "up"); !strings.Contains(r.stdout, "sqlite") {
		t.Fatalf("migrate up with MILLBOX_DSN: %s", r)
	}
	mustRun(t, "status")
	mustRun(t, "--dsn", "file:"+path, "status", "--json")
}

func TestParseDSN(t *testing.T) {
	t.Parallel()
	for dsn, want := range map[string]string{
		"postgres://app:secret@db:5433/shop?sslmode=disable": "postgres db:5433/shop",
		"postgresql://db/shop":                               "postgres db:5432/shop",
		"host=db port=5433 dbname=shop user=app":             "postgres db:5433/shop",
		"mysql://app:secret@tcp(db:3307)/shop":               "mysql db:3307/shop",
		"mysql://app:secret@db/shop?timeout=5s":              "mysql db:3306/shop",
		"app:secret@tcp(db:3306)/shop":                       "mysql db:3306/shop",
		"sqlite:///var/lib/app.db":                           "sqlite /var/lib/app.db",
		"sqlite://rel/app.db?x=1":                            "sqlite rel/app.db",
		"file:app.db":                                        "sqlite app.db",
	} {
		tg, err := parseDSN(dsn)
		if err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		if got := tg.kind + " " + tg.where; got != want {
			t.Fatalf("%s: got %q, want %q", dsn, got, want)
		}
		if tg.kind == "mysql" && (!tg.my.ParseTime || tg.my.Loc != time.UTC) {
			t.Fatalf("%s: MySQL must parse times in UTC", dsn)
		}
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "missing.db")
	for _, c := range []struct{ dsn, want string }{
		{"postgres://root@127.0.0.1:1/test?connect_timeout=5", "cannot reach the database: PostgreSQL at 127.0.0.1:1/test"},
		{"root@tcp(127.0.0.1:1)/test", "cannot reach the database: MySQL at 127.0.0.1:1/test"},
		{"sqlite://" + missing, "millbox migrate up"},
	} {
		r := runCmd(t, "status", "--dsn", c.dsn)
		if r.code != exitError || !strings.Contains(r.stderr, c.want) {
			t.Fatalf("--dsn %s: want exit 1 with %q, got %s", c.dsn, c.want, r)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Fatal("status created the SQLite file")
	}
}

func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"--db", "postgres", "--schema", "messaging"}, []string{"Statements are idempotent", "-- millbox postgres migration 1:", `CREATE SCHEMA IF NOT EXISTS "messaging";`, `CREATE TABLE IF NOT EXISTS "messaging"."millbox_outbox"`, `"messaging"."millbox_inbox"`}, nil},
		{[]string{"--dsn", "postgres://localhost:1/app"}, []string{`CREATE TABLE IF NOT EXISTS "millbox_outbox"`}, []string{"CREATE SCHEMA"}},
		{[]string{"--dsn", "postgres://localhost:1/app", "--schema", "app"}, []string{`CREATE SCHEMA IF NOT EXISTS "app";`, `CREATE TABLE IF NOT EXISTS "app"."millbox_outbox"`}, nil},
		{[]string{"--db", "postgres", "--schema", "app", "--partitioned"}, []string{`CREATE SCHEMA IF NOT EXISTS "app";`, `"app"."millbox_outbox"`}, nil},
		{[]string{"--db", "mysql", "--schema", "shop", "--outbox-table", "events"}, []string{"CREATE DATABASE IF NOT EXISTS `shop`", "`shop`.`events`"}, nil},
		{[]string{"--dsn", "sqlite://x.db", "--inbox-table", "seen"}, []string{`CREATE TABLE IF NOT EXISTS "seen"`, "Apply each version once"}, []string{"CREATE SCHEMA", "idempotent"}},
		{[]string{"--db", "mysql"}, []string{"Statements are idempotent", "-- millbox mysql migration 1:"}, []string{"CREATE DATABASE"}},
		{[]string{"--db", "postgres", "--without-inbox"}, []string{`CREATE TABLE IF NOT EXISTS "millbox_outbox"`}, []string{`CREATE TABLE IF NOT EXISTS "millbox_inbox"`}},
		{[]string{"--db", "mysql", "--without-inbox"}, []string{"CREATE TABLE IF NOT EXISTS `millbox_outbox`"}, []string{"CREATE TABLE IF NOT EXISTS `millbox_inbox`"}},
	} {
		r := mustRun(t, append([]string{"migrate", "sql"}, c.args...)...)
		for _, w := range c.want {
			if !strings.Contains(r.stdout, w) {
				t.Fatalf("migrate sql %v: no %q in\n%s", c.args, w, r.stdout)
			}
		}
		for _, n := range c.not {
			if strings.Contains(r.stdout, n) {
				t.Fatalf("migrate sql %v: unexpected %q in\n%s", c.args, n, r.stdout)
			}
		}
		// The schema or database holding the tables comes first.
		if i := strings.Index(r.stdout, "CREATE SCHEMA"); i > strings.Index(r.stdout, "CREATE TABLE") {
			t.Fatalf("migrate sql %v: the schema is created after a table\n%s", c.args, r.stdout)
		}
		if i := strings.Index(r.stdout, "CREATE DATABASE"); i > strings.Index(r.stdout, "CREATE TABLE") {
			t.Fatalf("migrate sql %v: the database is created after a table\n%s", c.args, r.stdout)
		}
	}
	if r := runCmd(t, "migrate", "sql", "--db", "sqlite", "--schema", "x"); r.code != exitUsage || !strings.Contains(r.stderr, "--schema") {
		t.Fatalf("sqlite with --schema: %s", r)
	}
	if r := runCmd(t, "migrate", "sql"); r.code != exitUsage || !strings.Contains(r.stderr, "--db") {
		t.Fatalf("migrate sql without a database: %s", r)
	}
}

func TestMigrateSQLAppliesToPostgres(t *testing.T) {
	t.Parallel()
	in := postgresInstallation(t)
	r := mustRun(t, append([]string{"migrate", "sql", "--dsn", in.dsn}, in.flags...)...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The script runs as a migration tool would run it, schema included.
	if _, err := in.db.(*pgxv5.DB).Unwrap().(*pgxpool.Pool).Exec(ctx, r.stdout); err != nil {
		t.Fatalf("apply migrate sql: %v\n%s", err, r.stdout)
	}
	var st statusOut
	runJSON(t, &st, append([]string{"status", "--dsn", in.dsn}, in.flags...)...)
	if st.Pending != 0 {
		t.Fatalf("status: %+v", st)
	}
}

func TestMigratePartitioned(t *testing.T) {
	t.Parallel()
	r := mustRun(t, "migrate", "sql", "--db", "postgres", "--partitioned", "--interval", "6h")
	if !strings.Contains(r.stdout, "PARTITION BY RANGE (created_at)") {
		t.Fatalf("migrate sql --partitioned prints no partitioned outbox:\n%s", r.stdout)
	}
	for _, args := range [][]string{
		{"migrate", "sql", "--db", "mysql", "--partitioned"},
		{"migrate", "sql", "--db", "sqlite", "--partitioned"},
		{"migrate", "sql", "--db", "postgres", "--interval", "6h"},
		{"migrate", "sql", "--db", "postgres", "--partitioned", "--interval", "90m"},
	} {
		if r := runCmd(t, args...); r.code != exitUsage || r.stderr == "" {
			t.Fatalf("%v: want a usage error, got %s", args, r)
		}
	}

	in := postgresInstallation(t)
	cli := func(args ...string) []string { return append(append(args, "--dsn", in.dsn), in.flags...) }
	mustRun(t, cli("migrate", "up", "--partitioned", "--interval", "6h")...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := in.db.(*pgxv5.DB).Unwrap().(*pgxpool.Pool)
	var kind string
	if err := pool.QueryRow(ctx, `SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = 'millbox_outbox'`, in.flags[1]).Scan(&kind); err != nil {
		t.Fatal(err)
	}
	if kind != "p" {
		t.Fatalf("migrate up --partitioned created relkind %q, want a partitioned table (p)", kind)
	}
	// The partitions command manages what migrate created.
	r = mustRun(t, cli("partitions", "maintain", "--interval", "6h")...)
	r = mustRun(t, cli("partitions", "list", "--interval", "6h")...)
	if !strings.Contains(r.stdout, "millbox_outbox_default") || !strings.Contains(r.stdout, "millbox_outbox_p") {
		t.Fatalf("partitions list after migrate up --partitioned:\n%s", r.stdout)
	}
}

func TestUsage(t *testing.T) {
	t.Parallel()
	r := mustRun(t, "help")
	for _, w := range []string{"migrate up", "dead requeue", "prune", "Examples:", "MILLBOX_DSN", "--yes"} {
		if !strings.Contains(r.stdout, w) {
			t.Fatalf("help lacks %q:\n%s", w, r.stdout)
		}
	}
	for _, args := range [][]string{{"help", "dead"}, {"dead", "--help"}, {"prune", "-h"}, {"status", "--help"}, {"migrate", "--help"}} {
		r := mustRun(t, args...)
		if !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "-dsn string") {
			t.Fatalf("%v:\n%s", args, r)
		}
	}
	for _, args := range [][]string{{}, {"frobnicate"}, {"dead"}, {"dead", "list", "--yes"}, {"dead", "show"}, {"dead", "show", "x"}, {"prune"}, {"status", "--nope"}, {"migrate"}, {"dead", "list", "--older-than", "soon"}, {"dead", "list", "--limit", "0"}, {"prune", "--inbox-older-than", "1d", "--batch", "0"}} {
		if r := runCmd(t, args...); r.code != exitUsage || r.stderr == "" {
			t.Fatalf("%v: want exit 2 with a message, got %s", args, r)
		}
	}
	if r := mustRun(t, "version"); !strings.HasPrefix(r.stdout, "millbox ") {
		t.Fatalf("version: %s", r)
	}
}

func TestParseAge(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"30s": 30 * time.Second, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "90m": 90 * time.Minute} {
		got, err := parseAge(in)
		if err != nil || got != want {
			t.Fatalf("parseAge(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7x", "1d2"} {
		if _, err := parseAge(in); err == nil {
			t.Fatalf("parseAge(%q) accepted", in)
		}
	}
}
