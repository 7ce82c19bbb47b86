package integration_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// rejecting is a real destination that fails every call carrying one of
// the rejected UUIDs, delivering none of that call's messages, until the
// UUID is accepted again: a message the broker refuses until an operator
// fixes what it needs.
type rejecting struct {
	message.Publisher
	mu       sync.Mutex
	rejected map[string]bool
}

func (r *rejecting) reject(uuid string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected[uuid] = on
}

func (r *rejecting) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	for _, m := range msgs {
		if r.rejected[m.UUID] {
			r.mu.Unlock()
			return fmt.Errorf("message %s refused", m.UUID)
		}
	}
	r.mu.Unlock()
	return r.Publisher.Publish(topic, msgs...)
}

// holdOutbox is one database's outbox for the hold tests, and the
// source its forwarders read it with (nil: Polling).
type holdOutbox struct {
	name string
	db   sqladapters.DB
	d    sqladapters.Dialect
	src  forwarder.Source
}

func holdOutboxes(t *testing.T) []holdOutbox {
	pool := testenv.Postgres(t)
	pg := pgxv5.WrapPool(pool)
	raw := testenv.MySQL(t)
	lite := stdsql.WrapDB(testenv.SQLite(t, testenv.SQLitePath(t)))
	return []holdOutbox{
		{"postgres", pg, testenv.PostgresDialect(t, pg, pool, postgres.Options{}), nil},
		{"mariadb", stdsql.WrapDB(raw), testenv.MySQLDialect(t, raw, mysql.Options{}), nil},
		{"sqlite", lite, testenv.SQLiteDialect(t, lite, sqlite.Options{}), nil},
	}
}

// holdFixture runs forwarders of one outbox into Kafka (kfake) through a
// destination that refuses chosen messages, and collects what arrives.
type holdFixture struct {
	t     *testing.T
	ctx   context.Context
	o     holdOutbox
	ops   *ops.Ops
	dest  *rejecting
	topic string
	got   *testenv.KafkaCollector
	hold  bool
	reads atomic.Int64 // reads of the outbox by the forwarders
}

func newHoldFixture(t *testing.T, o holdOutbox, hold bool) *holdFixture {
	topic := testenv.UniqueName("held")
	k := testenv.StartKafka(t, topic)
	o2, err := ops.New(o.db, o.d)
	if err != nil {
		t.Fatal(err)
	}
	return &holdFixture{
		t: t, ctx: testenv.Ctx(t, 2*time.Minute), o: o, ops: o2, topic: topic, hold: hold,
		dest: &rejecting{Publisher: k.KeyedPublisher(t), rejected: map[string]bool{}},
		got:  k.Collect(t, topic),
	}
}

// start runs a forwarder instance and returns its stop.
func (f *holdFixture) start() (stop func()) {
	f.t.Helper()
	var src forwarder.Source = forwarder.Polling{Partitions: 4, LeaseTTL: 2 * time.Second}
	if f.o.src != nil {
		src = f.o.src
	}
	fw, err := forwarder.New(forwarder.Config{
		DB: f.o.db, Dialect: f.o.d, Destination: f.dest,
		Source:              conformance.PollEvery(src, 20*time.Millisecond),
		MaxAttempts:         3,
		Retry:               forwarder.ExponentialRetry{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond},
		DelayedPollInterval: 20 * time.Millisecond,
		DeadLetterHoldsKey:  f.hold,
		Logger:              testenv.Logger(f.t),
		Hooks:               forwarder.Hooks{OnRead: func(int) { f.reads.Add(1) }},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- fw.Run(context.Background()) }()
	select {
	case <-fw.Running():
	case err := <-errc:
		f.t.Fatalf("forwarder stopped at start: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := fw.Close(); err != nil {
				f.t.Errorf("close forwarder: %v", err)
			}
			if err := <-errc; err != nil {
				f.t.Errorf("forwarder run: %v", err)
			}
		})
	}
	f.t.Cleanup(stop)
	return stop
}

// publish writes the messages seq from..to of key in one transaction and
// returns their UUIDs; the destination refuses those numbered in reject.
func (f *holdFixture) publish(key string, from, to int, reject ...int) []string {
	f.t.Helper()
	var msgs []*message.Message
	var uuids []string
	for seq := from; seq <= to; seq++ {
		m := message.NewMessage(watermill.NewUUID(), []byte(key+" "+strconv.Itoa(seq)))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
		m.Metadata.Set("seq", strconv.Itoa(seq))
		if slices.Contains(reject, seq) {
			f.dest.reject(m.UUID, true)
		}
		msgs = append(msgs, m)
		uuids = append(uuids, m.UUID)
	}
	publishMessages(f.t, f.ctx, f.o.db, f.o.d, f.topic, msgs...)
	return uuids
}

// wait waits until every one of uuids arrived.
func (f *holdFixture) wait(uuids ...string) {
	f.t.Helper()
	if err := f.got.WaitUUIDs(f.ctx, uuids, time.Minute); err != nil {
		f.t.Fatal(err)
	}
}

// waitReads waits until the forwarders have read the outbox n more times.
func (f *holdFixture) waitReads(n int64) {
	f.t.Helper()
	want := f.reads.Load() + n
	for f.reads.Load() < want {
		select {
		case <-f.ctx.Done():
			f.t.Fatalf("%d reads of the outbox, want %d", f.reads.Load(), want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// seqs returns the sequence numbers of key's first deliveries, in arrival
// order.
func (f *holdFixture) seqs(key string) []int {
	var out []int
	for _, r := range f.got.FirstDeliveries() {
		if r.Key == key {
			n, _ := strconv.Atoi(r.Metadata["seq"])
			out = append(out, n)
		}
	}
	return out
}

// dead waits for the dead letter of uuid and returns it.
func (f *holdFixture) dead(uuid string) sqladapters.DeadLetter {
	f.t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		dls, err := f.ops.ListDeadLetters(f.ctx, ops.ListQuery{})
		if err != nil {
			f.t.Fatal(err)
		}
		for _, dl := range dls {
			if dl.UUID == uuid {
				return dl
			}
		}
	}
	f.t.Fatalf("message %s never became a dead letter", uuid)
	return sqladapters.DeadLetter{}
}

func (f *holdFixture) heldKeys() []ops.HeldKey {
	f.t.Helper()
	ks, err := f.ops.HeldKeys(f.ctx, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	return ks
}

// TestDeadLetterHoldsKey: with Config.DeadLetterHoldsKey, a key whose
// message 2 dies delivers 1 only while other keys flow, also through a
// restart of the forwarder; requeued (through ops), the dead letter goes
// first and the held messages follow in order. A discarded dead letter
// lets its key go on. Without the option, the key goes on past its dead
// letter.
func TestDeadLetterHoldsKey(t *testing.T) {
	outboxes := holdOutboxes(t)
	// The same on PostgreSQL with the change-data-capture source, each
	// case with a slot of its own.
	cdcOutbox := func(t *testing.T) holdOutbox {
		e := newCDCEnv(t)
		e.setup(t, testenv.Ctx(t, time.Minute))
		return holdOutbox{"cdc", e.db, e.d, e.src}
	}
	t.Run("cdc", func(t *testing.T) {
		t.Run("requeue", func(t *testing.T) { holdRequeue(t, cdcOutbox(t)) })
		t.Run("discard", func(t *testing.T) { holdDiscard(t, cdcOutbox(t)) })
		t.Run("off", func(t *testing.T) { holdOff(t, cdcOutbox(t)) })
	})
	for _, o := range outboxes {
		t.Run(o.name, func(t *testing.T) {
			t.Run("requeue", func(t *testing.T) { holdRequeue(t, o) })
			t.Run("discard", func(t *testing.T) { holdDiscard(t, o) })
			t.Run("off", func(t *testing.T) { holdOff(t, o) })
		})
	}
}

func holdRequeue(t *testing.T, o holdOutbox) {
	f := newHoldFixture(t, o, true)
	stop := f.start()
	held := f.publish("held", 1, 4, 2)
	other := f.publish("other", 1, 5)
	dl := f.dead(held[1])
	if !dl.Holds {
		t.Fatalf("the dead letter does not hold its key: %+v", dl)
	}
	f.wait(append(other, held[0])...)

	// A new instance sees the hold in the table: the key stays held while
	// other keys, and messages without a key, keep flowing.
	stop()
	f.start()
	more := f.publish("other", 6, 8)
	held = append(held, f.publish("held", 5, 5)...)
	f.wait(more...)
	if got := f.seqs("held"); !slices.Equal(got, []int{1}) {
		t.Fatalf("key held behind its dead letter delivered %v, want [1]", got)
	}
	if got, want := f.heldKeys(), []ops.HeldKey{{Key: "held", DeadLetterID: dl.ID, Held: 3}}; !slices.Equal(got, want) {
		t.Fatalf("held keys %+v, want %+v", got, want)
	}
	st, err := f.ops.Status(f.ctx)
	if err != nil || st.HeldKeys != 1 {
		t.Fatalf("status: %d held keys, %v; want 1", st.HeldKeys, err)
	}

	// A message of the key written while it is held waits too, behind
	// the earlier ones.
	// Reads from the first row, every PollInterval, move the polling
	// forwarder's floor past the rows it delivered; the held ones must
	// stay above it.
	f.wait(f.publish("other", 9, 9)...)
	if f.o.src == nil {
		f.waitReads(50)
	}
	held = append(held, f.publish("held", 6, 6)...)

	f.dest.reject(held[1], false)
	if n, err := f.ops.Requeue(f.ctx, ops.Filter{IDs: []int64{dl.ID}}, ops.ChangeOptions{}); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	// Other keys' messages wake the forwarder: its next read must not
	// start past the requeued and the held rows.
	f.wait(f.publish("other", 10, 10)...)
	f.wait(held...)
	if got := f.seqs("held"); !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) {
		t.Fatalf("key after requeue delivered %v, want [1 2 3 4 5 6]", got)
	}
	if got, want := f.seqs("other"), seqRange(1, 10); !slices.Equal(got, want) {
		t.Fatalf("the other key delivered %v, want %v", got, want)
	}
	if ks := f.heldKeys(); len(ks) != 0 {
		t.Fatalf("held keys after requeue: %+v", ks)
	}
}

func holdDiscard(t *testing.T, o holdOutbox) {
	f := newHoldFixture(t, o, true)
	stop := f.start()
	held := f.publish("held", 1, 4, 2)
	other := f.publish("other", 1, 3)
	dl := f.dead(held[1])
	f.wait(append(other, held[0])...)
	more := f.publish("other", 4, 5)
	f.wait(more...)
	if got := f.seqs("held"); !slices.Equal(got, []int{1}) {
		t.Fatalf("key held behind its dead letter delivered %v, want [1]", got)
	}
	// A key held with nothing behind it holds a message written later,
	// also by a forwarder started after it died.
	lone := f.publish("lone", 1, 2, 2)
	loneDead := f.dead(lone[1])
	f.wait(lone[0])
	stop()
	f.start()
	lone = append(lone, f.publish("lone", 3, 3)...)
	f.wait(f.publish("other", 6, 6)...)
	if got := f.seqs("lone"); !slices.Equal(got, []int{1}) {
		t.Fatalf("key held with nothing behind its dead letter delivered %v, want [1]", got)
	}
	if n, err := f.ops.Discard(f.ctx, ops.Filter{IDs: []int64{dl.ID, loneDead.ID}}, ops.ChangeOptions{}); err != nil || n != 2 {
		t.Fatalf("discard: %d, %v", n, err)
	}
	f.wait(append(held[2:], lone[2])...)
	if got := f.seqs("held"); !slices.Equal(got, []int{1, 3, 4}) {
		t.Fatalf("key after discard delivered %v, want [1 3 4]", got)
	}
	if got := f.seqs("lone"); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("key after discard delivered %v, want [1 3]", got)
	}
	if ks := f.heldKeys(); len(ks) != 0 {
		t.Fatalf("held keys after discard: %+v", ks)
	}
}

func holdOff(t *testing.T, o holdOutbox) {
	f := newHoldFixture(t, o, false)
	f.start()
	held := f.publish("held", 1, 4, 2)
	dl := f.dead(held[1])
	f.wait(held[0], held[2], held[3])
	if got := f.seqs("held"); !slices.Equal(got, []int{1, 3, 4}) {
		t.Fatalf("key without holds delivered %v, want [1 3 4]", got)
	}
	if dl.Holds {
		t.Fatalf("a dead letter of a forwarder without holds holds its key: %+v", dl)
	}
	if ks := f.heldKeys(); len(ks) != 0 {
		t.Fatalf("held keys without holds: %+v", ks)
	}
}

// seqRange returns from..to.
func seqRange(from, to int) []int {
	var out []int
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}
