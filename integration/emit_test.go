package integration_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
)

// The outbox without a table (forwarder.PublisherConfig.WithoutTable): the
// publisher writes each call's messages into the WAL as a logical decoding
// message, the CDC source decodes them from the stream.

// emit commits msgs for topic in one transaction through a publisher
// without a table.
func (e *cdcEnv) emit(ctx context.Context, topic string, msgs ...*message.Message) error {
	tx, err := e.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return err
	}
	p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: e.src.Slot})
	if err == nil {
		err = p.Publish(topic, msgs...)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// countWrites makes the database count every row written into the
// outbox, the dead letters and the kept rows from now on (a trigger of the
// test's own); written reads the count.
func (e *cdcEnv) countWrites(t *testing.T, ctx context.Context) {
	t.Helper()
	schema := `"` + e.d.Schema() + `"`
	stmts := []string{
		`CREATE TABLE ` + schema + `.test_writes (tbl text NOT NULL)`,
		`CREATE FUNCTION ` + schema + `.test_count_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	INSERT INTO ` + schema + `.test_writes VALUES (TG_TABLE_NAME);
	RETURN NULL;
END $$`,
	}
	for _, table := range []string{e.d.OutboxTable(), e.d.Tables()[5], e.d.Tables()[6]} {
		stmts = append(stmts, `CREATE TRIGGER test_count_write AFTER INSERT ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+schema+`.test_count_write()`)
	}
	for _, s := range stmts {
		if _, err := e.pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *cdcEnv) written(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM "`+e.d.Schema()+`".test_writes`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestEmitRolledBack: messages published without a table in a transaction
// that rolls back are written nowhere and never delivered; those of a
// transaction that commits are delivered, and nothing touches the table.
func TestEmitRolledBack(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("emit_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, time.Minute)
	e.setup(t, ctx)
	e.countWrites(t, ctx)
	cfg := e.cfg
	cfg.Destination = k.KeyedPublisher(t)
	e.start(t, cfg)

	tx, err := e.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: e.src.Slot})
	if err != nil {
		t.Fatal(err)
	}
	rolledBack := []*message.Message{keyedMsg("k", 0), keyedMsg("k", 1), message.NewMessage(watermill.NewUUID(), []byte("x"))}
	if err := p.Publish(topic, rolledBack...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	committed := keyedMsg("k", 2)
	if err := e.emit(ctx, topic, committed); err != nil {
		t.Fatal(err)
	}
	if err := col.WaitUUIDs(ctx, []string{committed.UUID}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
	if n := col.Distinct(); n != 1 {
		t.Fatalf("%d messages delivered, want only the committed one", n)
	}
	for _, m := range rolledBack {
		if _, ok := col.Get(m.UUID); ok {
			t.Fatalf("message %s of the rolled back transaction was delivered", m.UUID)
		}
	}
	if n := e.written(t, ctx); n != 0 {
		t.Fatalf("%d rows were written into the tables, want none", n)
	}
}

// TestEmitMessageTooLarge: a message over MaxMessageBytesWithoutTable is
// refused at PublishTx with ErrInvalidMessage, naming the limit, before
// anything is written: the transaction stays usable and commits the
// messages published after.
func TestEmitMessageTooLarge(t *testing.T) {
	e := newCDCEnv(t)
	ctx := testenv.Ctx(t, time.Minute)
	e.setup(t, ctx)
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: e.src.Slot, MaxPayloadBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := e.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	small := message.NewMessage(watermill.NewUUID(), []byte("fits"))
	large := message.NewMessage(watermill.NewUUID(), make([]byte, forwarder.MaxMessageBytesWithoutTable))
	err = pub.PublishTx(ctx, tx, "t", small, large)
	if !errors.Is(err, forwarder.ErrInvalidMessage) || !strings.Contains(err.Error(), "MaxMessageBytesWithoutTable") || !strings.Contains(err.Error(), large.UUID) {
		t.Fatalf("a message over the limit: %v, want ErrInvalidMessage naming it and the limit", err)
	}
	// Just under the limit is accepted.
	fits := message.NewMessage(watermill.NewUUID(), make([]byte, forwarder.MaxMessageBytesWithoutTable-len(small.UUID)-2-100))
	if err := pub.PublishTx(ctx, tx, "t", small, fits); err != nil {
		t.Fatalf("messages within the limit: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after the refused call: %v", err)
	}
	// A table publisher has no such limit below the dialect's.
	tx, err = e.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	table, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: e.d, MaxPayloadBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if err := table.PublishTx(ctx, tx, "t", large); err != nil {
		t.Fatalf("the same message into the table: %v", err)
	}
}

// TestEmitPoisonKey: published without a table, one message of one key
// fails every time. Its failure is written into the outbox, retried with
// backoff and dead-lettered after MaxAttempts; the other keys all arrive in
// order without touching a table; the later messages of the poison key
// wait in the outbox and arrive in order, after it is dead; requeued, it
// arrives; the key then flows through the stream again.
func TestEmitPoisonKey(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("emit_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 3*time.Minute)
	e.setup(t, ctx)
	e.countWrites(t, ctx)
	poison := keyedMsg("poison", 0)
	pub := &failingPublisher{Publisher: k.KeyedPublisher(t), match: func(m *message.Message) bool { return m.UUID == poison.UUID }}
	pub.failing.Store(true)
	var mu sync.Mutex
	var failures []forwarder.FailedAttempt
	var deadAt time.Time
	cfg := e.cfg
	cfg.Destination = pub
	cfg.MaxAttempts = 3
	cfg.Retry = forwarder.ExponentialRetry{Min: 100 * time.Millisecond, Max: 200 * time.Millisecond}
	conformance.SetPollInterval(&cfg, time.Hour)
	cfg.Hooks.OnFailure = func(f forwarder.FailedAttempt) {
		mu.Lock()
		defer mu.Unlock()
		if f.UUID != poison.UUID {
			t.Errorf("failure recorded for %s, not the poison message", f.UUID)
		}
		failures = append(failures, f)
		if f.Dead {
			deadAt = time.Now()
		}
	}
	e.start(t, cfg)

	var uuids, later []string
	for i := range 20 {
		msgs := []*message.Message{}
		for k := range 10 {
			msgs = append(msgs, keyedMsg("key-"+strconv.Itoa(k), i))
		}
		switch {
		case i == 0:
			msgs = append(msgs, poison)
		case i < 5:
			m := keyedMsg("poison", i)
			later = append(later, m.UUID)
			msgs = append(msgs, m)
		}
		for _, m := range msgs {
			if m != poison {
				uuids = append(uuids, m.UUID)
			}
		}
		if err := e.emit(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if _, ok := col.Get(poison.UUID); ok {
		t.Fatal("the poison message was delivered")
	}
	mu.Lock()
	if len(failures) != 3 || !failures[2].Dead || failures[0].Dead || failures[1].Dead {
		t.Fatalf("failures = %+v, want 3 attempts, the last one dead", failures)
	}
	for _, u := range later {
		r, _ := col.Get(u)
		if r.Arrived.Before(deadAt) {
			t.Fatalf("message %s of the poison key arrived before the poison message was dead", u)
		}
	}
	mu.Unlock()
	dls, err := listDeadLetters(ctx, e.db, e.d)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].UUID != poison.UUID || dls[0].Attempts != 3 || dls[0].LastError == "" || string(dls[0].Payload) != "" && string(dls[0].Payload) != string(poison.Payload) {
		t.Fatalf("dead letters = %+v", dls)
	}
	// Only the poison key touched the tables: its failed message (written,
	// then moved to the dead letters) and the messages that waited behind
	// it, at most.
	if n := e.written(t, ctx); n < 2 || n > int64(2+len(later)) {
		t.Fatalf("%d rows written into the tables for %d messages, want 2 to %d: only the poison key's", n, len(uuids)+1, 2+len(later))
	}

	time.Sleep(time.Second)
	pub.failing.Store(false)
	if n, err := requeueAll(ctx, e.db, e.d); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	// Generous: the requeue reaches the forwarder through the slot, whose
	// decoder reads all the cluster's WAL, other tests' bulk loads too.
	if err := col.WaitUUIDs(ctx, []string{poison.UUID}, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	r, _ := col.Get(poison.UUID)
	if string(r.Metadata["seq"]) != "0" {
		t.Fatalf("the requeued message arrived with metadata %v", r.Metadata)
	}
	before := e.written(t, ctx)
	next := keyedMsg("poison", 5)
	if err := e.emit(ctx, topic, next); err != nil {
		t.Fatal(err)
	}
	if err := col.WaitUUIDs(ctx, []string{next.UUID}, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.waitDrained(t, ctx, false)
	if dls, err := listDeadLetters(ctx, e.db, e.d); err != nil || len(dls) != 0 {
		t.Fatalf("dead letters after requeue: %d, %v", len(dls), err)
	}
	// The requeue moved it back (one insert); the key's next message
	// streams, or goes through the table while the key is still handed.
	if n := e.written(t, ctx) - before; n > 0 {
		t.Logf("the key's next message went through the table: it was still handed to polling")
	}
}

// TestEmitMixedKeyOrder: publishers with and without a table write the
// same keys, in separate transactions and in the same one, while some
// messages fail their first attempt (their key then waits in the table):
// every message arrives, each key in order.
func TestEmitMixedKeyOrder(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("emit_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 3*time.Minute)
	e.setup(t, ctx)
	var failed sync.Map
	var failures atomic.Int64
	pub := &failingPublisher{Publisher: k.KeyedPublisher(t), match: func(m *message.Message) bool {
		// Every 25th message fails once.
		seq, _ := strconv.Atoi(m.Metadata.Get("seq"))
		if seq%25 != 7 {
			return false
		}
		_, again := failed.LoadOrStore(m.UUID, true)
		if !again {
			failures.Add(1)
		}
		return !again
	}}
	pub.failing.Store(true)
	cfg := e.cfg
	cfg.Destination = pub
	cfg.Retry = forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond}
	e.start(t, cfg)

	const keys, rounds = 8, 60
	var uuids []string
	seq := map[int]int{}
	for i := range rounds {
		var table, emitted []*message.Message
		for key := range keys {
			for range 1 + (i+key)%3 {
				m := keyedMsg("key-"+strconv.Itoa(key), seq[key])
				seq[key]++
				uuids = append(uuids, m.UUID)
				// Alternate the kind of publisher message by message:
				// one transaction holds both, in order.
				if seq[key]%2 == 0 {
					table = append(table, m)
				} else {
					emitted = append(emitted, m)
				}
			}
		}
		tx, err := e.db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tp, _ := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d})
		ep, _ := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: e.src.Slot})
		// Publish key by key in seq order, switching publishers as the
		// messages alternate.
		ti, ei := 0, 0
		for ti < len(table) || ei < len(emitted) {
			if ei == len(emitted) || ti < len(table) && lessSeq(table[ti], emitted[ei]) {
				err = tp.Publish(topic, table[ti])
				ti++
			} else {
				err = ep.Publish(topic, emitted[ei])
				ei++
			}
			if err != nil {
				sqladapters.Rollback(tx)
				t.Fatal(err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := col.WaitUUIDs(ctx, uuids, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if failures.Load() == 0 {
		t.Fatal("no message failed: the test did not exercise the table path")
	}
	t.Logf("%d messages, %d failed once, %d duplicates", len(uuids), failures.Load(), col.Duplicates())
	e.waitDrained(t, ctx, false)
}

// lessSeq orders messages by key, then seq.
func lessSeq(a, b *message.Message) bool {
	ka, kb := a.Metadata.Get(forwarder.DefaultKeyMetadataField), b.Metadata.Get(forwarder.DefaultKeyMetadataField)
	if ka != kb {
		return ka < kb
	}
	sa, _ := strconv.Atoi(a.Metadata.Get("seq"))
	sb, _ := strconv.Atoi(b.Metadata.Get("seq"))
	return sa < sb
}

// TestEmitRedeliveredAfterCrash: the active reader, in a child process,
// delivers messages published without a table and is killed with SIGKILL
// before it confirmed them on the slot (its StatusInterval is long). The
// WAL still holds them: the next reader delivers every one again, each key
// in order. Duplicates, never a loss.
func TestEmitRedeliveredAfterCrash(t *testing.T) {
	e := newCDCEnv(t)
	topic := testenv.UniqueName("emit_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	ctx := testenv.Ctx(t, 3*time.Minute)
	e.setup(t, ctx)
	e.countWrites(t, ctx)

	cmd := exec.Command(os.Args[0], "-test.run=^TestCDCChildProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "MILLBOX_CDC_CHILD=1", "MILLBOX_CDC_SCHEMA="+e.d.Schema(),
		"MILLBOX_CDC_SLOT="+e.src.Slot, "MILLBOX_CDC_KAFKA="+k.Addr(), "MILLBOX_CDC_STATUS=30s")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	active := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "CDC-ACTIVE") {
				once.Do(func() { close(active) })
			}
		}
	}()
	select {
	case <-active:
	case <-time.After(60 * time.Second):
		t.Fatal("the child never became the active reader")
	}
	started := time.Now()

	const n = 2000
	var uuids []string
	for i := 0; i < n; i += 100 {
		var msgs []*message.Message
		for j := i; j < i+100; j++ {
			m := keyedMsg("key-"+strconv.Itoa(j%20), j/20)
			uuids = append(uuids, m.UUID)
			msgs = append(msgs, m)
		}
		if err := e.emit(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	var end string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		t.Fatal(err)
	}
	if err := col.WaitUUIDs(ctx, uuids, time.Minute); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill() // SIGKILL
	_ = cmd.Wait()
	if time.Since(started) > 25*time.Second {
		t.Skip("the child took too long to deliver: it may have confirmed the messages on the slot, and the test would prove nothing")
	}
	var confirmed bool
	if err := e.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, e.src.Slot, end).Scan(&confirmed); err != nil {
		t.Fatal(err)
	}
	if confirmed {
		t.Fatal("the slot was confirmed past the messages before the kill: nothing would be delivered again")
	}
	if d := col.Duplicates(); d != 0 {
		t.Fatalf("%d duplicates before the crash", d)
	}

	cfg := e.with(func(s *cdc.Source) { s.StandbyRetry = 100 * time.Millisecond })
	cfg.Destination = k.KeyedPublisher(t)
	e.start(t, cfg)
	for deadline := time.Now().Add(time.Minute); col.Len() < 2*n; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after the crash: %d deliveries of %d messages, want each twice", col.Len(), col.Distinct())
		}
	}
	e.waitDrained(t, ctx, false)
	if got := col.Len(); got != 2*n || col.Distinct() != n {
		t.Fatalf("%d deliveries of %d messages, want each twice", got, col.Distinct())
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	// The deliveries after the crash keep each key's order too.
	last := map[string]int{}
	for _, r := range col.Records()[n:] {
		s, _ := strconv.Atoi(r.Metadata["seq"])
		if l, ok := last[r.Key]; ok && s <= l {
			t.Fatalf("after the crash, key %s: seq %d arrived after %d", r.Key, s, l)
		}
		last[r.Key] = s
	}
	if n := e.written(t, ctx); n != 0 {
		t.Fatalf("%d rows written into the tables, want none", n)
	}
}

// A publisher without a table writes into the WAL only while its own
// forwarder's slot exists (PublisherConfig.Slot): another slot of the
// database, another outbox's or another tool's, would hold messages that
// no forwarder of this outbox reads once that slot is gone. Without its
// slot, the call's messages go into the outbox table.
func TestEmitNeedsItsOwnSlot(t *testing.T) {
	e := newCDCEnv(t)
	ctx := testenv.Ctx(t, time.Minute)
	e.setup(t, ctx) // a slot exists: e.src.Slot
	pending := func() int64 {
		t.Helper()
		st, err := e.d.OutboxStats(ctx, e.db)
		if err != nil {
			t.Fatal(err)
		}
		return st.Pending
	}
	publish := func(slot string) {
		t.Helper()
		tx, err := e.db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: slot})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Publish("t", message.NewMessage(watermill.NewUUID(), []byte("x"))); err != nil {
			sqladapters.Rollback(tx)
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	publish(e.src.Slot)
	if n := pending(); n != 0 {
		t.Fatalf("with its slot, the message went into the table (%d pending rows)", n)
	}
	publish(e.src.Slot + "_gone")
	if n := pending(); n != 1 {
		t.Fatalf("without its slot (another slot exists), %d pending rows in the table, want the message there", n)
	}
	publish("*")
	if n := pending(); n != 1 {
		t.Fatalf(`with Slot "*" and a slot in the database, the message went into the table (%d pending rows)`, n)
	}
	if _, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: e.d, WithoutTable: true, Slot: "Bad-Slot"}); !errors.Is(err, forwarder.ErrInvalidConfig) {
		t.Fatalf("a bad slot name: %v, want ErrInvalidConfig", err)
	}
}
