package dialecttest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// Builder returns the SQL builder behind d, a dialect of one of millbox's
// database packages. It panics for any other dialect.
func Builder(d sqladapters.Dialect) sqlstore.Builder {
	b, ok := sqlstore.BuilderOf(d)
	if !ok {
		panic(fmt.Sprintf("dialecttest: %T has no SQL builder", d))
	}
	return b
}

// PendingReads returns the two pending reads of the builder behind d whose
// plans tests read, by name: the plain one and the one with ages, which
// the forwarder runs. It panics for a builder that reads no ages.
func PendingReads(d sqladapters.Dialect) map[string]func(sqladapters.PendingQuery) sqladapters.Query {
	b := Builder(d)
	if _, ok := b.SelectPendingWithAge(sqladapters.PendingQuery{}); !ok {
		panic(fmt.Sprintf("dialecttest: the builder %T reads no ages", b))
	}
	return map[string]func(sqladapters.PendingQuery) sqladapters.Query{
		"SelectPending": b.SelectPending,
		"SelectPendingWithAge": func(q sqladapters.PendingQuery) sqladapters.Query {
			s, _ := b.SelectPendingWithAge(q)
			return s
		},
	}
}

// Statements returns one of every statement the builder behind d builds,
// by name, plus the edge cases that change the SQL text: no owned
// partitions, and empty id and partition lists.
func Statements(dialect sqladapters.Dialect) map[string]sqladapters.Query {
	d := Builder(dialect)
	msgs := []sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte("p"), Metadata: []byte(`{}`), Key: "k", KeyHash: 3}}
	lock, unlock := d.LockMigrations()
	qs := map[string]sqladapters.Query{
		"Lock":               lock,
		"Unlock":             unlock,
		"AppliedMigrations":  d.AppliedMigrations(),
		"RecordMigration":    d.RecordMigration(1, "x"),
		"InsertOutbox":       d.InsertOutbox(msgs)[0],
		"InsertScheduled":    d.InsertScheduled([]sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte("p"), Metadata: []byte(`{}`), Key: "k", KeyHash: 3, DueAt: time.Now()}})[0],
		"NextDue":            d.NextDue(),
		"SelectPending":      d.SelectPending(sqladapters.PendingQuery{Limit: 10}),
		"SelectPendingOwned": d.SelectPending(sqladapters.PendingQuery{Partitions: 4, Owned: []int{1, 3}, Limit: 10}),
		"SelectPendingNone":  d.SelectPending(sqladapters.PendingQuery{Partitions: 4, Owned: []int{}, Limit: 10}),
		"SelectPendingExcl":  d.SelectPending(sqladapters.PendingQuery{Exclude: []int64{5, 6}, Limit: 10}),
		"SelectPendingHeld":  d.SelectPending(sqladapters.PendingQuery{DeadLetterHolds: true, SkipKeys: []string{"k"}, Limit: 10}),
		"SelectHeldKeys":     d.SelectHeldKeys(10),
		"CountHeldKeys":      d.CountHeldKeys(),
		"OutboxStats":        d.OutboxStats(),
		"CountPartitions":    d.CountPartitions(),
		"Heartbeat":          d.Heartbeat("i", time.Second),
		"CountMembers":       d.CountMembers(),
		"RemoveMember":       d.RemoveMember("i"),
		"ClaimPartitions":    d.ClaimPartitions("i", time.Second, 2),
		"RenewPartitions":    d.RenewPartitions("i", time.Second),
		"OwnedPartitions":    d.OwnedPartitions("i"),
		"ReleasePartitions":  d.ReleasePartitions("i", []int{0, 1}),
		"ReleaseNone":        d.ReleasePartitions("i", nil),
		"InsertInbox":        d.InsertInbox("c", "m"),
		"DeleteInboxBefore":  d.DeleteInboxBefore(time.Now(), 10),
	}
	for name, steps := range map[string][]sqladapters.Query{
		"CompleteDelete":     d.CompleteForwarded([]int64{1, 2}, false),
		"CompleteKeep":       d.CompleteForwarded([]int64{1, 2}, true),
		"CompleteNone":       d.CompleteForwarded(nil, false),
		"RecordFailure":      d.RecordFailure(sqladapters.Failure{ID: 1, Attempts: 2, Error: "e", Backoff: time.Second}),
		"RecordFailureDead":  d.RecordFailure(sqladapters.Failure{ID: 1, Attempts: 2, Error: "e", Dead: true}),
		"RecordFailureHold":  d.RecordFailure(sqladapters.Failure{ID: 1, Attempts: 2, Error: "e", Dead: true, Hold: true}),
		"RequeueDeadLetters": d.RequeueDeadLetters([]int64{1}),
	} {
		for i, q := range steps {
			qs[fmt.Sprint(name, i)] = q
		}
	}
	move := d.MoveDue(time.Now(), 10)
	if move.Lock.SQL != "" {
		qs["MoveDueLock"] = move.Lock
	}
	var claimed []int64
	if move.Claim.SQL != "" {
		qs["ClaimDue"] = move.Claim
		claimed = []int64{1, 2}
	}
	for i, q := range move.Move(claimed) {
		qs[fmt.Sprint("MoveDue", i)] = q
	}
	for name, declared := range map[string]func() (sqladapters.Query, bool){
		"HighWaterMark":  d.HighWaterMark,
		"PendingHorizon": d.PendingHorizon,
		"NotifyProbe":    d.NotifyProbe,
		"DeleteInboxRange": func() (sqladapters.Query, bool) {
			return d.DeleteInboxRange(time.Now().Add(-time.Hour), time.Now(), 10)
		},
	} {
		if q, ok := declared(); ok {
			qs[name] = q
		}
	}
	for i, q := range d.PendingReadSetup() {
		qs[fmt.Sprint("PendingReadSetup", i)] = q
	}
	for i, q := range d.EnsurePartitions(4) {
		qs[fmt.Sprint("EnsurePartitions", i)] = q
	}
	for i, q := range d.CreateMigrationsTable() {
		qs[fmt.Sprint("CreateMigrationsTable", i)] = q
	}
	for _, m := range d.Migrations() {
		for i, s := range m.Statements {
			qs[fmt.Sprintf("Migration%d.%d", m.Version, i)] = sqladapters.Query{SQL: s}
		}
	}
	addOperations(qs, d)
	return qs
}

// addOperations adds the statements of the operations verbs: with no
// filter, and with every filter set.
func addOperations(qs map[string]sqladapters.Query, d sqlstore.Builder) {
	fp, none := sqladapters.FingerprintError("e"), sqladapters.ErrorFingerprint{}
	all := sqladapters.DeadLetterFilter{IDs: []int64{1, 2}, Topic: "t", Key: "k", ErrorContains: "e", Fingerprint: &fp, OlderThan: time.Minute, NewerThan: time.Hour}
	for suffix, f := range map[string]sqladapters.DeadLetterFilter{"": {}, "Filtered": all, "Unfingerprinted": {Fingerprint: &none}} {
		qs["SelectDeadLetters"+suffix] = d.SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: f, Limit: 10})
		qs["SelectDeadLettersPayloads"+suffix] = d.SelectDeadLetters(sqladapters.DeadLetterQuery{Filter: f, AfterID: 3, Limit: 10, Payloads: true})
		qs["SelectDeadLetterIDs"+suffix] = d.SelectDeadLetterIDs(f, 0, 10)
		qs["CountDeadLetters"+suffix] = d.CountDeadLetters(f)
		qs["GroupDeadLetters"+suffix] = d.GroupDeadLetters(f, 10)
	}
	now := time.Now()
	qs["TopicStats"] = d.TopicStats()
	qs["InboxStats"] = d.InboxStats()
	qs["PartitionLeases"] = d.PartitionLeases()
	qs["DeleteDeadLetters"] = d.DeleteDeadLetters([]int64{1, 2})
	qs["CountForwardedBefore"] = d.CountForwardedBefore(now)
	qs["SelectForwardedIDs"] = d.SelectForwardedIDs(now, 0, 10)
	qs["DeleteForwarded"] = d.DeleteForwarded([]int64{1, 2})
	qs["CountInboxBefore"] = d.CountInboxBefore(now)
}

// CheckNameClashes checks that build, a dialect's constructor, refuses
// every pair of table names that leads two of the names the migrations
// create to one: an inbox table named as any table, index or sequence of
// the outbox's (a partition's name where the builder lists partitions),
// and an outbox table named as the inbox's indexes, upper-cased too where
// the database folds case. The error wraps sqladapters.ErrInvalidName and
// names the name.
func CheckNameClashes(t *testing.T, build func(outbox, inbox string) (sqladapters.Dialect, error), fold bool) {
	t.Helper()
	const outbox, inbox = "events", "seen"
	d, err := build(outbox, inbox)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(o, i, name string) {
		t.Helper()
		_, err := build(o, i)
		if !errors.Is(err, sqladapters.ErrInvalidName) || !strings.Contains(err.Error(), "both lead to") || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(name)) {
			t.Errorf("OutboxTable %q and InboxTable %q: %v; want ErrInvalidName naming %q", o, i, err, name)
		}
	}
	n := 0
	for _, obj := range Builder(d).Objects() {
		name := obj.Name
		if obj.Prefix {
			name += "20250101_0000"
		}
		switch {
		case name == inbox:
		case strings.HasPrefix(name, inbox+"_"):
			if !obj.Table {
				refused(name, inbox, name)
			}
		default:
			refused(outbox, name, name)
			if fold {
				refused(outbox, strings.ToUpper(name), name)
			}
		}
		n++
	}
	if n < 2 {
		t.Fatalf("the builder lists %d objects", n)
	}
}
