package integration_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/sqladapters"
)

// dialectOps runs a dialect's operations, and plain SQL, on a test database
// and fails the test on any error.
type dialectOps struct {
	t   *testing.T
	ctx context.Context
	db  sqladapters.DB
	d   sqladapters.Dialect
}

func (o *dialectOps) exec(q sqladapters.Query) int64 {
	o.t.Helper()
	n, err := q.Exec(o.ctx, o.db)
	if err != nil {
		o.t.Fatalf("%v\n%s", o.d.ClassifyError(err), q.SQL)
	}
	return n
}

// ints runs q and returns its first column.
func (o *dialectOps) ints(q sqladapters.Query) []int64 {
	o.t.Helper()
	rows, err := q.Query(o.ctx, o.db)
	if err != nil {
		o.t.Fatalf("%v\n%s", o.d.ClassifyError(err), q.SQL)
	}
	defer rows.Close()
	out := []int64{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			o.t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		o.t.Fatal(err)
	}
	return out
}

// insert writes one row per message, with topic "t", metadata {} and an
// empty payload where the message leaves them out, and returns their ids.
func (o *dialectOps) insert(msgs ...sqladapters.OutboxMessage) []int64 {
	o.t.Helper()
	for i := range msgs {
		if msgs[i].Topic == "" {
			msgs[i].Topic = "t"
		}
		if msgs[i].Metadata == nil {
			msgs[i].Metadata = []byte("{}")
		}
		if msgs[i].Payload == nil {
			msgs[i].Payload = []byte{}
		}
	}
	before := o.ints(sqladapters.Query{SQL: `SELECT COALESCE(MAX(id), 0) FROM ` + o.d.OutboxTable()})[0]
	if err := o.d.InsertOutbox(o.ctx, o.db, msgs); err != nil {
		o.t.Fatal(err)
	}
	return o.ints(sqladapters.Query{SQL: `SELECT id FROM ` + o.d.OutboxTable() + ` WHERE id > ` + strconv.FormatInt(before, 10) + ` ORDER BY id`})
}

// pending returns the rows ReadPending returns, in order; Limit 0 reads up
// to 1,000.
func (o *dialectOps) pending(q sqladapters.PendingQuery) []conformance.Row {
	o.t.Helper()
	if q.Limit == 0 {
		q.Limit = 1000
	}
	rows, err := o.d.ReadPending(o.ctx, o.db, q, false)
	if err != nil {
		o.t.Fatal(err)
	}
	var out []conformance.Row
	for _, p := range rows {
		out = append(out, conformance.Row{ID: p.ID, Topic: p.Topic, UUID: p.UUID, Payload: p.Payload, Key: p.Key, Attempts: p.Attempts})
	}
	return out
}

// check fails the test when err is not nil.
func (o *dialectOps) check(err error) {
	o.t.Helper()
	if err != nil {
		o.t.Fatal(err)
	}
}

// fail records a failed attempt and returns the rows it changed.
// deadLetters returns up to 100 dead letters, in id order.
func (o *dialectOps) deadLetters() []sqladapters.DeadLetter {
	o.t.Helper()
	dls, err := o.d.ListDeadLetters(o.ctx, o.db, sqladapters.DeadLetterQuery{Limit: 100})
	o.check(err)
	return dls
}

func (o *dialectOps) fail(f sqladapters.Failure) int64 {
	o.t.Helper()
	n, err := o.d.RecordFailure(o.ctx, o.db, f)
	o.check(err)
	return n
}

// tableOf returns the quoted name of the table of d whose name ends in
// suffix, such as "_leases" or "_migrations".
func tableOf(t *testing.T, d sqladapters.Dialect, suffix string) string {
	t.Helper()
	for _, table := range d.(interface{ Tables() []string }).Tables() {
		if strings.HasSuffix(strings.Trim(table, "\"`"), suffix) {
			return table
		}
	}
	t.Fatalf("the %s dialect has no table ending in %s", d.Name(), suffix)
	return ""
}

// uuidsOf lists the rows' UUIDs, space-separated.
func uuidsOf(rows []conformance.Row) string {
	uuids := make([]string, len(rows))
	for i, r := range rows {
		uuids[i] = r.UUID
	}
	return strings.Join(uuids, " ")
}
