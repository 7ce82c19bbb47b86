package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// lateBound bounds how late a delayed message may arrive in these tests:
// far above the PollInterval the promise is about, so that a busy machine
// cannot fail them, and far below what a message left behind would take.
const lateBound = 10 * time.Second

// delayed runs the suite of delayed messages: not before their time, then
// soon; in their key's order when they become due; bad delays refused.
func delayed(t *testing.T, env Env, fast func(t testing.TB, d sqladapters.Dialect, dest message.Publisher) forwarder.Config) {
	ctx := context.Background()
	src := env.Sources[0]

	t.Run("ArriveNotBeforeTheirTime", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		StartForwarder(t, fast(t, d, rec))
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		now := message.NewMessage(watermill.NewUUID(), []byte("now"))
		at := message.NewMessage(watermill.NewUUID(), []byte("DeliverAt"))
		dueAt := time.Now().Add(1500 * time.Millisecond)
		forwarder.DeliverAt(at, dueAt)
		wm := message.NewMessage(watermill.NewUUID(), []byte("delay.For"))
		delay.Message(wm, delay.For(2*time.Second))
		forOnly := message.NewMessage(watermill.NewUUID(), []byte("for only"))
		forOnly.Metadata.Set(forwarder.DelayedForMetadataField, "1s")
		past := message.NewMessage(watermill.NewUUID(), []byte("past"))
		forwarder.DeliverAt(past, time.Now().Add(-time.Minute))
		far := message.NewMessage(watermill.NewUUID(), []byte("far"))
		forwarder.DeliverAfter(far, time.Hour)
		published := time.Now()
		if err := pub.Publish("delayed", now, at, wm, forOnly, past, far); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		st, err := d.OutboxStats(ctx, env.DB)
		if err != nil {
			t.Fatal(err)
		}
		if st.Scheduled < 1 || st.NextDue.IsZero() {
			t.Fatalf("stats %+v: the message due in an hour is not counted as scheduled", st)
		}
		wmDue, err := time.Parse(time.RFC3339, wm.Metadata.Get(forwarder.DelayedUntilMetadataField))
		if err != nil {
			t.Fatal(err)
		}
		rec.WaitFor(t, 5, 30*time.Second)
		got := map[string]Delivered{}
		for _, m := range rec.Messages() {
			got[m.UUID] = m
		}
		for _, c := range []struct {
			m   *message.Message
			due time.Time
		}{{at, dueAt}, {wm, wmDue}, {forOnly, published.Add(time.Second)}} {
			g := got[c.m.UUID]
			if g.At.Before(c.due) {
				t.Fatalf("message %q arrived at %v, before its due time %v", c.m.Payload, g.At, c.due)
			}
			if late := g.At.Sub(c.due); late > lateBound {
				t.Fatalf("message %q arrived %v after its due time", c.m.Payload, late)
			}
			if string(g.Payload) != string(c.m.Payload) || g.Metadata.Get(forwarder.DelayedUntilMetadataField) != c.m.Metadata.Get(forwarder.DelayedUntilMetadataField) {
				t.Fatalf("message %q arrived as %+v", c.m.Payload, g)
			}
		}
		for _, m := range []*message.Message{now, past} {
			if _, ok := got[m.UUID]; !ok {
				t.Fatalf("message %q did not arrive", m.Payload)
			}
		}
		if _, ok := got[far.UUID]; ok {
			t.Fatal("the message due in an hour arrived")
		}
		st, err = d.OutboxStats(ctx, env.DB)
		if err != nil {
			t.Fatal(err)
		}
		if st.Scheduled != 1 || st.NextDue.Before(published.Add(time.Hour-time.Second)) {
			t.Fatalf("stats %+v, want the message due in an hour alone scheduled", st)
		}
	})

	// A delayed message does not hold its key back; when due it goes after
	// the key's messages in the outbox then; messages of one due time keep
	// their publish order.
	t.Run("JoinTheirKeyWhenDue", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		StartForwarder(t, fast(t, d, rec))
		due := time.Now().Add(time.Second)
		keyed := func(name string, at time.Time) *message.Message {
			m := message.NewMessage(watermill.NewUUID(), []byte(name))
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, "k")
			if !at.IsZero() {
				forwarder.DeliverAt(m, at)
			}
			return m
		}
		tx := src.MustBegin(t, ctx)
		if err := newPub(t, tx, d).Publish("delayed",
			keyed("a1", time.Time{}), keyed("far", time.Now().Add(time.Hour)), keyed("d1", due), keyed("d2", due),
			keyed("d0", due.Add(-300*time.Millisecond)), keyed("a2", time.Time{})); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rec.WaitFor(t, 5, 30*time.Second)
		var order []string
		for _, m := range rec.Messages() {
			order = append(order, string(m.Payload))
		}
		if strings.Join(order, " ") != "a1 a2 d0 d1 d2" {
			t.Fatalf("key k arrived in the order %v, want a1 a2 d0 d1 d2 (far still waiting)", order)
		}
	})

	// Every instance moves due messages into the outbox; however many do
	// at once, each key's messages reach the destination in due order, and
	// those of one due time in publish order.
	for _, instances := range []int{2, 3} {
		t.Run(fmt.Sprintf("KeepTheirKeysDueOrderWith%dInstances", instances), func(t *testing.T) {
			d := env.NewDialect(t)
			rec := NewRecorder()
			var fs []*forwarder.Forwarder
			for range instances {
				cfg := fast(t, d, rec)
				cfg.BatchSize = 100
				fs = append(fs, StartForwarder(t, cfg))
			}
			if env.polling() {
				WaitOwned(t, fs, 8, true)
			} else {
				WaitOwned(t, fs, 1, false)
			}
			// Message seq of each key is due at seq/5 milliseconds after the
			// first: five messages of a key share each due time, and
			// seq order is due order, then publish order. All are published
			// in one call, keys interleaved, so that all are scheduled, and
			// every instance's mover wakes at the first due time.
			const keys, perKey = 20, 150
			first := time.Now().Add(2 * time.Second)
			msgs := make([]*message.Message, 0, keys*perKey)
			for seq := range perKey {
				for k := range keys {
					m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d-%d", k, seq)))
					m.Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprintf("key-%d", k))
					m.Metadata.Set("seq", strconv.Itoa(seq))
					forwarder.DeliverAt(m, first.Add(time.Duration(seq/5)*time.Millisecond))
					msgs = append(msgs, m)
				}
			}
			if err := publishCommitted(ctx, src, forwarder.PublisherConfig{Dialect: d}, "delayed", msgs); err != nil {
				t.Fatal(err)
			}
			rec.WaitFor(t, keys*perKey, 60*time.Second)
			CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
			waitEmpty(t, ctx, env, d)
		})
	}

	// With a PollInterval of an hour, only the due times the forwarder
	// learns wake it: from the table when it starts (a message written by
	// another process), and from a publisher in its own process.
	t.Run("WokenAtTheDueTime", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		other := sqladapters.OutboxMessage{Topic: "delayed", UUID: watermill.NewUUID(), Payload: []byte("other"), Metadata: []byte(`{}`),
			DueAt: time.Now().Add(500 * time.Millisecond)}
		if err := d.InsertOutbox(ctx, env.DB, []sqladapters.OutboxMessage{other}); err != nil {
			t.Fatal(err)
		}
		cfg := fast(t, d, rec)
		SetPollInterval(&cfg, time.Hour)
		StartForwarder(t, cfg)
		rec.WaitFor(t, 1, 30*time.Second)
		tx := src.MustBegin(t, ctx)
		m := message.NewMessage(watermill.NewUUID(), []byte("here"))
		forwarder.DeliverAfter(m, 500*time.Millisecond)
		if err := newPub(t, tx, d).Publish("delayed", m); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rec.WaitFor(t, 2, 30*time.Second)
	})

	t.Run("BadDelayIsRefused", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		good := message.NewMessage(watermill.NewUUID(), []byte("good"))
		forwarder.DeliverAfter(good, time.Minute)
		bad := message.NewMessage(watermill.NewUUID(), []byte("bad"))
		bad.Metadata.Set(forwarder.DelayedUntilMetadataField, "next tuesday")
		err := pub.Publish("delayed", message.NewMessage(watermill.NewUUID(), nil), good, bad)
		if !errors.Is(err, forwarder.ErrInvalidMessage) || !strings.Contains(err.Error(), forwarder.DelayedUntilMetadataField) || !strings.Contains(err.Error(), `"next tuesday"`) {
			t.Fatalf("publish with a bad delay: %v, want ErrInvalidMessage naming the field and the value", err)
		}
		// Nothing of the call was written, and the transaction goes on.
		commit(t, ctx, tx)
		if st, err := d.OutboxStats(ctx, env.DB); err != nil || st.Pending != 0 || st.Scheduled != 0 {
			t.Fatalf("stats after a refused call %+v, %v; want nothing written", st, err)
		}
	})

	t.Run("RollbackWritesNothing", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		m := message.NewMessage(watermill.NewUUID(), nil)
		forwarder.DeliverAfter(m, time.Minute)
		if err := newPub(t, tx, d).Publish("delayed", m, message.NewMessage(watermill.NewUUID(), nil)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := d.OutboxStats(ctx, env.DB); err != nil || st.Pending != 0 || st.Scheduled != 0 {
			t.Fatalf("stats after a rollback %+v, %v; want nothing written", st, err)
		}
	})
}
