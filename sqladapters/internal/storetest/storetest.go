// Package storetest is the conformance suite of the store contract,
// sqladapters.Dialect: Run exercises every method of a dialect against a
// real database, through the DB a test gives it, and checks what the
// publisher, the forwarder, the inbox and the operations tools depend on.
// Each database package runs it with every adapter it supports.
package storetest

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Setup is the database one run of the suite uses.
type Setup struct {
	// DB is the database the suite runs on.
	DB sqladapters.DB
	// New returns a dialect whose tables no other test uses, not yet
	// migrated. It removes whatever the test creates in the database
	// after the test (t.Cleanup).
	New func(t *testing.T) sqladapters.Dialect
	// InUse, when set, counts the connections of DB in use, so that the
	// suite can check that no transaction was left open.
	InUse func() int
	// Skip names cases not to run (such as "InsertOutbox"), each with the
	// reason: a known defect of the adapter, which the skip message
	// reports.
	Skip map[string]string
}

// Run runs the suite: one subtest per domain of the contract (migrations,
// outbox writes, pending reads, leases, dead letters and the operations
// verbs, inbox, the change-data-capture source's statements, the upkeep
// of a partitioned outbox), and in it
// one subtest per case. The cases run one after
// the other, each on tables of its own.
func Run(t *testing.T, s Setup) {
	t.Helper()
	if s.DB == nil || s.New == nil {
		t.Fatal("storetest: Setup needs DB and New")
	}
	for _, domain := range []struct {
		name  string
		cases []testCase
	}{
		{"Migrations", migrationCases},
		{"Outbox", outboxCases},
		{"Moves", moveCases},
		{"Scheduled", scheduledCases},
		{"Pending", pendingCases},
		{"Leases", leaseCases},
		{"DeadLetters", deadLetterCases},
		{"Holds", holdCases},
		{"Inbox", inboxCases},
		{"Logical", logicalCases},
		{"Partitions", partitionCases},
	} {
		t.Run(domain.name, func(t *testing.T) {
			for _, c := range domain.cases {
				t.Run(c.name, func(t *testing.T) {
					if reason, ok := s.Skip[c.name]; ok {
						t.Skip(reason)
					}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					c.run(&env{t: t, ctx: ctx, s: s, db: s.DB})
				})
			}
		})
	}
}

// testCase is one case of the suite.
type testCase struct {
	name string
	run  func(*env)
}

// env is one subtest's view of the database.
type env struct {
	t   *testing.T
	ctx context.Context
	s   Setup
	db  sqladapters.DB
	d   sqladapters.Dialect
}

// migrated gives e a fresh migrated dialect and returns it.
func (e *env) migrated() sqladapters.Dialect {
	e.t.Helper()
	e.d = e.s.New(e.t)
	if err := sqladapters.Migrate(e.ctx, e.db, e.d); err != nil {
		e.t.Fatalf("migrate: %v", err)
	}
	return e.d
}

func (e *env) check(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// noneInUse checks that no connection of the DB is in use, when the setup
// can tell.
func (e *env) noneInUse(after string) {
	e.t.Helper()
	if e.s.InUse == nil {
		return
	}
	if n := e.s.InUse(); n != 0 {
		e.t.Fatalf("%d connections in use after %s: a transaction was left open", n, after)
	}
}

// msg is a message of the suite: its payload and metadata name its uuid.
func msg(uuid, key string, keyHash int32) sqladapters.OutboxMessage {
	return sqladapters.OutboxMessage{
		Topic:    "topic." + uuid,
		UUID:     uuid,
		Payload:  []byte("payload of " + uuid),
		Metadata: []byte(`{"uuid":"` + uuid + `"}`),
		Key:      key,
		KeyHash:  keyHash,
	}
}

// msgs returns n keyless messages named prefix0, prefix1, ..., placed in
// partitions by their position.
func msgs(prefix string, n int) []sqladapters.OutboxMessage {
	out := make([]sqladapters.OutboxMessage, n)
	for i := range out {
		out[i] = msg(fmt.Sprint(prefix, i), "", int32(i))
	}
	return out
}

// insert writes ms in one committed transaction and returns their ids, in
// the order of ms.
func (e *env) insert(ms ...sqladapters.OutboxMessage) []int64 {
	e.t.Helper()
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	if err := e.d.InsertOutbox(e.ctx, tx, ms); err != nil {
		sqladapters.Rollback(tx)
		e.t.Fatalf("InsertOutbox: %v", err)
	}
	e.check(tx.Commit(e.ctx), "commit")
	ids := map[string]int64{}
	for _, r := range e.pending(sqladapters.PendingQuery{Limit: 100000}) {
		ids[r.UUID] = r.ID
	}
	out := make([]int64, len(ms))
	for i, m := range ms {
		id, ok := ids[m.UUID]
		if !ok {
			e.t.Fatalf("message %s inserted but not pending", m.UUID)
		}
		out[i] = id
	}
	return out
}

func (e *env) pending(q sqladapters.PendingQuery) []sqladapters.OutboxRow {
	e.t.Helper()
	rows, err := e.d.ReadPending(e.ctx, e.db, q, false)
	e.check(err, "ReadPending")
	return rows
}

func (e *env) pendingIDs(q sqladapters.PendingQuery) []int64 {
	e.t.Helper()
	return ids(e.pending(q))
}

func ids(rows []sqladapters.OutboxRow) []int64 {
	out := []int64{}
	for _, r := range rows {
		out = append(out, r.ID)
	}
	return out
}

// count returns the number of rows in table, by plain SQL all databases
// understand.
func (e *env) count(table string) int64 {
	e.t.Helper()
	rows, err := e.db.Query(e.ctx, `SELECT count(*) FROM `+table)
	e.check(err, "count")
	defer rows.Close()
	var n int64
	for rows.Next() {
		e.check(rows.Scan(&n), "scan count")
	}
	e.check(rows.Err(), "count")
	return n
}

// table returns the quoted name of the dialect's table named after the
// outbox with suffix, such as "_dead" or "_kept".
func (e *env) table(suffix string) string {
	e.t.Helper()
	tabler, ok := e.d.(interface{ Tables() []string })
	if !ok {
		e.t.Fatalf("%T does not list its tables", e.d)
	}
	want := strings.Trim(e.d.OutboxTable()[strings.LastIndex(e.d.OutboxTable(), ".")+1:], "\"`") + suffix
	for _, t := range tabler.Tables() {
		if strings.Trim(t[strings.LastIndex(t, ".")+1:], "\"`") == want {
			return t
		}
	}
	e.t.Fatalf("the %s dialect has no table %s", e.d.Name(), want)
	return ""
}

// exec runs a statement of plain SQL that every database understands.
func (e *env) exec(query string) {
	e.t.Helper()
	_, err := e.db.Exec(e.ctx, query)
	e.check(err, query)
}

// backdate moves the creation of row id back by d, in the database's own
// time arithmetic.
func (e *env) backdate(id int64, d time.Duration) {
	e.t.Helper()
	secs := fmt.Sprint(int64(d / time.Second))
	var set string
	switch e.d.Name() {
	case "postgres":
		set = `created_at = created_at - interval '` + secs + ` seconds'`
	case "mysql":
		set = `created_at = created_at - INTERVAL ` + secs + ` SECOND`
	case "sqlite":
		set = `created_at = strftime('%Y-%m-%dT%H:%M:%fZ', created_at, '-` + secs + ` seconds')`
	default:
		e.t.Fatalf("backdate: unknown database %s", e.d.Name())
	}
	e.exec(`UPDATE ` + e.d.OutboxTable() + ` SET ` + set + ` WHERE id = ` + fmt.Sprint(id))
}

func (e *env) stats() sqladapters.OutboxStats {
	e.t.Helper()
	st, err := e.d.OutboxStats(e.ctx, e.db)
	e.check(err, "OutboxStats")
	return st
}

func (e *env) fail(f sqladapters.Failure) int64 {
	e.t.Helper()
	n, err := e.d.RecordFailure(e.ctx, e.db, f)
	e.check(err, "RecordFailure")
	return n
}

func (e *env) owned(instance string) []int {
	e.t.Helper()
	p, err := e.d.OwnedPartitions(e.ctx, e.db, instance)
	e.check(err, "OwnedPartitions")
	return p
}

func (e *env) members() int {
	e.t.Helper()
	n, err := e.d.CountMembers(e.ctx, e.db)
	e.check(err, "CountMembers")
	return n
}

func (e *env) partitions() int {
	e.t.Helper()
	n, err := e.d.CountPartitions(e.ctx, e.db)
	e.check(err, "CountPartitions")
	return n
}

func (e *env) record(consumer, id string) bool {
	e.t.Helper()
	first, err := e.d.RecordInbox(e.ctx, e.db, consumer, id)
	e.check(err, "RecordInbox")
	return first
}
