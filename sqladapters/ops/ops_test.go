package ops_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.uber.org/goleak"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a migrated PostgreSQL installation in a schema of its own,
// on the server of MILLBOX_POSTGRES_URL. The command's tests run the same
// operations on MySQL and SQLite.
type fixture struct {
	t   *testing.T
	ctx context.Context
	db  sqladapters.DB
	d   *postgres.Dialect
	o   *ops.Ops
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	o, err := ops.New(db, d)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, ctx: ctx, db: db, d: d, o: o}
}

// publish writes one message per uuid to topic and returns the row ids.
func (f *fixture) publish(topic string, uuids ...string) []int64 {
	f.t.Helper()
	tx, err := f.db.Begin(f.ctx, sql.TxOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: f.d})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, u := range uuids {
		if err := pub.Publish(topic, message.NewMessage(u, []byte("payload of "+u))); err != nil {
			f.t.Fatal(err)
		}
	}
	if err := tx.Commit(f.ctx); err != nil {
		f.t.Fatal(err)
	}
	rows, err := f.d.ReadPending(f.ctx, f.db, sqladapters.PendingQuery{Limit: 1000}, false)
	if err != nil {
		f.t.Fatal(err)
	}
	var ids []int64
	for _, r := range rows {
		if slices.Contains(uuids, r.UUID) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

func (f *fixture) kill(id int64, errText string) {
	f.t.Helper()
	if _, err := f.d.RecordFailure(f.ctx, f.db, sqladapters.Failure{ID: id, Attempts: 3, Error: errText, Dead: true}); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) deadIDs(flt ops.Filter) []int64 {
	f.t.Helper()
	dls, err := f.o.ListDeadLetters(f.ctx, ops.ListQuery{Filter: flt})
	if err != nil {
		f.t.Fatal(err)
	}
	var ids []int64
	for _, dl := range dls {
		ids = append(ids, dl.ID)
	}
	return ids
}

func TestNewRefusesNil(t *testing.T) {
	if _, err := ops.New(nil, postgres.MustNew(postgres.Options{})); err == nil {
		t.Fatal("New accepted a nil database")
	}
	if _, err := ops.New(stdsql.WrapDB(&sql.DB{}), nil); err == nil {
		t.Fatal("New accepted a nil dialect")
	}
}

func TestDeadLetters(t *testing.T) {
	f := newFixture(t)
	ids := f.publish("orders", "a", "b", "c", "d", "e")
	f.kill(ids[0], "timeout")
	f.kill(ids[1], "timeout")
	f.kill(ids[2], "bad payload")

	if got := f.deadIDs(ops.Filter{}); !slices.Equal(got, ids[:3]) {
		t.Fatalf("all dead letters: %v", got)
	}
	if got := f.deadIDs(ops.Filter{IDs: []int64{ids[1], ids[3]}}); !slices.Equal(got, ids[1:2]) {
		t.Fatalf("by ids, one of them pending: %v", got)
	}
	n, err := f.o.CountDeadLetters(f.ctx, ops.Filter{ErrorContains: "time"})
	if err != nil || n != 2 {
		t.Fatalf("count: %d, %v", n, err)
	}
	groups, err := f.o.GroupDeadLetters(f.ctx, ops.Filter{}, 0)
	if err != nil || len(groups) != 2 || groups[0].Error != "timeout" || groups[0].Count != 2 || groups[0].SampleID != ids[0] {
		t.Fatalf("groups: %+v, %v", groups, err)
	}
	if _, err := f.o.ShowDeadLetter(f.ctx, ids[3]); !errors.Is(err, ops.ErrNotFound) {
		t.Fatalf("show of a pending row: %v", err)
	}
	dl, err := f.o.ShowDeadLetter(f.ctx, ids[2])
	if err != nil || dl.UUID != "c" || string(dl.Payload) != "payload of c" || dl.LastError != "bad payload" {
		t.Fatalf("show: %+v, %v", dl, err)
	}

	// Requeue in batches of one reports progress per batch.
	var progress []int64
	n, err = f.o.Requeue(f.ctx, ops.Filter{ErrorContains: "timeout"}, ops.ChangeOptions{BatchSize: 1, Progress: func(c int64) { progress = append(progress, c) }})
	if err != nil || n != 2 || !slices.Equal(progress, []int64{1, 2}) {
		t.Fatalf("requeue: %d, %v, progress %v", n, err, progress)
	}
	// Discard never deletes a row that is no longer dead.
	n, err = f.o.Discard(f.ctx, ops.Filter{IDs: ids}, ops.ChangeOptions{})
	if err != nil || n != 1 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	st, err := f.o.Status(f.ctx)
	if err != nil || st.Pending != 4 || st.Dead != 0 || len(st.Topics) != 1 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if _, err := f.o.Requeue(f.ctx, ops.Filter{All: true}, ops.ChangeOptions{BatchSize: ops.MaxBatchSize + 1}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("oversized batch: %v", err)
	}
}

// TestChangeOfEverythingNeedsAll checks that Requeue and Discard refuse a
// filter that selects every dead letter, an empty id list included,
// unless it says All, and All with another field; with All alone they
// change every dead letter.
func TestChangeOfEverythingNeedsAll(t *testing.T) {
	f := newFixture(t)
	ids := f.publish("orders", "a", "b", "c")
	for _, id := range ids {
		f.kill(id, "timeout")
	}
	for _, c := range []struct {
		name   string
		filter ops.Filter
		want   error
	}{
		{"zero", ops.Filter{}, ops.ErrEverything},
		{"empty ids", ops.Filter{IDs: []int64{}}, ops.ErrEverything},
		{"no age", ops.Filter{OlderThan: -time.Hour}, ops.ErrEverything},
		{"all and a topic", ops.Filter{All: true, Topic: "orders"}, sqladapters.ErrInvalidConfig},
		{"all and ids", ops.Filter{All: true, IDs: ids[:1]}, sqladapters.ErrInvalidConfig},
	} {
		for verb, change := range map[string]func(context.Context, ops.Filter, ops.ChangeOptions) (int64, error){
			"requeue": f.o.Requeue, "discard": f.o.Discard,
		} {
			n, err := change(f.ctx, c.filter, ops.ChangeOptions{})
			if !errors.Is(err, c.want) || n != 0 || !strings.Contains(err.Error(), "Filter.All") || !strings.Contains(err.Error(), verb) {
				t.Fatalf("%s with the filter %s (%+v): %d, %v; want %v naming Filter.All and %s", verb, c.name, c.filter, n, err, c.want, verb)
			}
		}
	}
	if got := f.deadIDs(ops.Filter{}); !slices.Equal(got, ids) {
		t.Fatalf("dead letters after refused changes: %v, want all of %v", got, ids)
	}
	if n, err := f.o.CountDeadLetters(f.ctx, ops.Filter{All: true}); err != nil || n != 3 {
		t.Fatalf("count with All: %d, %v; want 3", n, err)
	}
	if n, err := f.o.Requeue(f.ctx, ops.Filter{All: true}, ops.ChangeOptions{BatchSize: 2}); err != nil || n != 3 {
		t.Fatalf("requeue with All: %d, %v; want 3", n, err)
	}
	f.kill(ids[0], "again")
	if n, err := f.o.Discard(f.ctx, ops.Filter{All: true}, ops.ChangeOptions{}); err != nil || n != 1 {
		t.Fatalf("discard with All: %d, %v; want 1", n, err)
	}
}

func TestPruneKeepsPendingAndDeadRows(t *testing.T) {
	f := newFixture(t)
	ids := f.publish("orders", "a", "b", "c", "d")
	// a and b were forwarded and kept; c is dead; d is pending.
	if _, err := f.d.CompleteForwarded(f.ctx, f.db, ids[:2], true); err != nil {
		t.Fatal(err)
	}
	f.kill(ids[2], "boom")
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, err := f.d.RecordInbox(f.ctx, f.db, "billing", id); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond) // let the rows age past the cut-off
	opts := ops.PruneOptions{ForwardedOlderThan: 10 * time.Millisecond, InboxOlderThan: 10 * time.Millisecond, BatchSize: 2}
	count, err := f.o.PruneCount(f.ctx, opts)
	if err != nil || count != (ops.PruneResult{Forwarded: 2, InboxRecords: 3}) {
		t.Fatalf("prune count: %+v, %v", count, err)
	}
	var reports []ops.PruneProgress
	opts.Progress = func(p ops.PruneProgress) { reports = append(reports, p) }
	res, err := f.o.Prune(f.ctx, opts)
	if err != nil || res != (ops.PruneResult{Forwarded: 2, InboxRecords: 3}) {
		t.Fatalf("prune: %+v, %v", res, err)
	}
	last := reports[len(reports)-1]
	if reports[0] != (ops.PruneProgress{Table: ops.TableForwarded, Total: 2}) || !last.Done || last.Table != ops.TableInbox || last.Deleted != 3 || last.Total != 3 {
		t.Fatalf("progress: %+v", reports)
	}
	st, err := f.o.Status(f.ctx)
	if err != nil || st.Pending != 1 || st.Dead != 1 || st.ForwardedKept != 0 || st.InboxRecords != 0 {
		t.Fatalf("status after prune: %+v, %v", st, err)
	}
}

func TestMissingTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := dialecttest.UniqueName("t_")
	if _, err := pool.Exec(ctx, `CREATE SCHEMA "`+schema+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	o, err := ops.New(pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{Schema: schema}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = o.Status(ctx)
	if !errors.Is(err, sqladapters.ErrMissingTable) {
		t.Fatalf("status on an empty schema: %v", err)
	}
	if n := strings.Count(err.Error(), "millbox:"); n != 1 {
		t.Fatalf("the error says millbox: %d times: %v", n, err)
	}
}

// recorder is a destination that remembers the uuids it was given.
type recorder struct {
	mu  sync.Mutex
	got map[string]bool
}

func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		r.got[m.UUID] = true
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) has(uuids []string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range uuids {
		if !r.got[u] {
			return false
		}
	}
	return true
}

// TestPruneWhileForwarding prunes forwarded rows as fast as it can while
// messages are published and forwarded: every message still arrives, so
// no pending row was deleted.
func TestPruneWhileForwarding(t *testing.T) {
	f := newFixture(t)
	rec := &recorder{got: map[string]bool{}}
	fwd, err := forwarder.New(forwarder.Config{DB: f.db, Dialect: f.d, Destination: rec, KeepForwarded: true, DelayedPollInterval: 5 * time.Millisecond, Source: forwarder.Polling{PollInterval: 5 * time.Millisecond, Partitions: 2}})
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(f.ctx) }()
	closed := false
	closeForwarder := func() {
		if closed {
			return
		}
		closed = true
		if err := fwd.Close(); err != nil {
			t.Error(err)
		}
		if err := <-runErr; err != nil {
			t.Error(err)
		}
	}
	defer closeForwarder()

	var uuids []string
	var pruned int64
	for batch := range 20 {
		var b []string
		for i := range 10 {
			b = append(b, fmt.Sprintf("m-%d-%d", batch, i))
		}
		f.publish("orders", b...)
		uuids = append(uuids, b...)
		res, err := f.o.Prune(f.ctx, ops.PruneOptions{ForwardedOlderThan: time.Millisecond, BatchSize: 7})
		if err != nil {
			t.Fatal(err)
		}
		pruned += res.Forwarded
	}
	for !rec.has(uuids) {
		if f.ctx.Err() != nil {
			t.Fatalf("not every message arrived while pruning: %v", f.ctx.Err())
		}
		if _, err := f.o.Prune(f.ctx, ops.PruneOptions{ForwardedOlderThan: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Close writes the completions still in flight.
	closeForwarder()
	st, err := f.o.Status(f.ctx)
	if err != nil || st.Pending != 0 || st.Dead != 0 {
		t.Fatalf("status: %+v, %v", st, err)
	}
	t.Logf("pruned %d forwarded rows while forwarding", pruned)
}
