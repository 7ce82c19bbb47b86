package integration_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/sqladapters"
)

// dialectOps runs a dialect's statements on a test database and fails the
// test on any error.
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
	for _, q := range o.d.InsertOutbox(msgs) {
		o.exec(q)
	}
	return o.ints(sqladapters.Query{SQL: `SELECT id FROM ` + o.d.OutboxTable() + ` WHERE id > ` + strconv.FormatInt(before, 10) + ` ORDER BY id`})
}

// pending returns the rows SelectPending returns, in order; Limit 0 reads
// up to 1,000.
func (o *dialectOps) pending(q sqladapters.PendingQuery) []conformance.Row {
	o.t.Helper()
	if q.Limit == 0 {
		q.Limit = 1000
	}
	rows, err := o.d.SelectPending(q).Query(o.ctx, o.db)
	if err != nil {
		o.t.Fatalf("%v", o.d.ClassifyError(err))
	}
	defer rows.Close()
	var out []conformance.Row
	for rows.Next() {
		var r conformance.Row
		var md []byte
		var key sql.NullString
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &md, &key, &r.Attempts); err != nil {
			o.t.Fatal(err)
		}
		r.Key = key.String
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		o.t.Fatal(err)
	}
	return out
}

// pendingIDs returns the ids of the rows SelectPending returns, in order.
func (o *dialectOps) pendingIDs(q sqladapters.PendingQuery) []int64 {
	o.t.Helper()
	var ids []int64
	for _, r := range o.pending(q) {
		ids = append(ids, r.ID)
	}
	return ids
}
