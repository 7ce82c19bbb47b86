package integration_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	wmw "github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// subscribeOne returns a function that waits for the next message on
// topic and acks it.
func subscribeOne(t *testing.T, sub message.Subscriber, topic string) func() *message.Message {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	return func() *message.Message {
		t.Helper()
		select {
		case m := <-ch:
			m.Ack()
			return m
		case <-time.After(conformance.WaitTimeout):
			t.Fatalf("no message on %s", topic)
			return nil
		}
	}
}

func TestInboxMiddleware(t *testing.T) {
	t.Parallel()

	for _, driver := range inboxDrivers {
		t.Run("PanicRollsBackAndPanicsAgain/"+driver, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixtureFor(t, driver)
			h := f.Middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
				if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
					return nil, err
				}
				panic("injected panic")
			})
			msg := message.NewMessage(watermill.NewUUID(), nil)
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				_, _ = h(msg)
			}()
			if recovered != "injected panic" {
				t.Fatalf("recovered %v, want the handler's panic", recovered)
			}
			if n := f.Effect(msg.UUID); n != 0 || len(f.InboxRows()) != 0 {
				t.Fatalf("panicking handler left effect %d and inbox rows %v", n, f.InboxRows())
			}
			if _, err := sqladapters.TxFromContext(msg.Context()); !errors.Is(err, sqladapters.ErrNoTx) {
				t.Fatalf("message context still holds the finished transaction: %v", err)
			}
			// A transaction holds its connection until it ends.
			if n := f.connsInUse(); n != 0 {
				t.Fatalf("%d connections still held by a transaction", n)
			}
		})
	}

	t.Run("RetryRecovererPoisonQueue", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		gc := conformance.NewGoChannel(t, true)
		poison := conformance.NewGoChannel(t, true)
		nextPoisoned := subscribeOne(t, poison, "poison")
		fl := newFailer()
		var mu sync.Mutex
		txs := map[string][]sqladapters.Tx{}
		var dirtyStarts atomic.Int64 // attempts that found an earlier attempt's effect
		handler := func(msg *message.Message) error {
			n := fl.next(msg.UUID)
			tx, err := sqladapters.TxFromContext(msg.Context())
			if err != nil {
				return err
			}
			mu.Lock()
			txs[msg.UUID] = append(txs[msg.UUID], tx)
			mu.Unlock()
			c, err := f.CountEffect(msg.UUID)
			if err != nil {
				return err
			}
			if c != 0 {
				dirtyStarts.Add(1)
			}
			if err := f.ApplyEffect(msg.Context(), msg.UUID); err != nil {
				return err
			}
			switch msg.Metadata.Get("mode") {
			case "flaky":
				switch n {
				case 1:
					return conformance.ErrInjected
				case 2:
					panic("injected panic")
				}
			case "poison":
				return conformance.ErrInjected
			}
			conformance.MarkHandled(msg)
			return nil
		}
		pq, err := wmw.PoisonQueue(poison, "poison")
		if err != nil {
			t.Fatal(err)
		}
		flaky := message.NewMessage(watermill.NewUUID(), nil)
		flaky.Metadata.Set("mode", "flaky")
		bad := message.NewMessage(watermill.NewUUID(), nil)
		bad.Metadata.Set("mode", "poison")
		conformance.PublishCopies(t, gc, "orders", flaky, 1)
		conformance.PublishCopies(t, gc, "orders", bad, 1)
		conformance.StartRouter(t, func(r *message.Router) {
			r.AddMiddleware(
				pq,
				wmw.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware,
				wmw.Recoverer,
				f.Middleware("billing"),
			)
			r.AddConsumerHandler("apply", "orders", gc, handler)
		})
		poisoned := nextPoisoned()
		if poisoned.UUID != bad.UUID || !strings.Contains(poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), conformance.ErrInjected.Error()) {
			t.Fatalf("poisoned %s (reason %q), want %s", poisoned.UUID, poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), bad.UUID)
		}
		f.WaitDeliveries(1)
		// A redelivery of the message that finally succeeded is skipped.
		conformance.PublishCopies(t, gc, "orders", flaky, 1)
		f.WaitDeliveries(2)

		if fl.count(flaky.UUID) != 3 || fl.count(bad.UUID) != 3 {
			t.Fatalf("attempts: flaky %d, poison %d; want 3 each", fl.count(flaky.UUID), fl.count(bad.UUID))
		}
		mu.Lock()
		for uuid, list := range txs {
			for i := range list {
				for j := range i {
					if list[i] == list[j] {
						t.Errorf("message %s: attempts %d and %d shared a transaction", uuid, j+1, i+1)
					}
				}
			}
		}
		mu.Unlock()
		if n := dirtyStarts.Load(); n != 0 {
			t.Fatalf("%d attempts saw an earlier attempt's effect", n)
		}
		if got := f.Effects(); len(got) != 1 || got[flaky.UUID] != 1 {
			t.Fatalf("effects %v, want only %s once", got, flaky.UUID)
		}
		if rows := f.InboxRows(); len(rows) != 1 || !strings.HasSuffix(rows[0], flaky.UUID) {
			t.Fatalf("inbox rows %v", rows)
		}
		if f.Duplicates() != 1 {
			t.Fatalf("duplicates %d, want 1", f.Duplicates())
		}
	})

	t.Run("MetadataID", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		gc := conformance.NewGoChannel(t, true)
		poison := conformance.NewGoChannel(t, true)
		nextPoisoned := subscribeOne(t, poison, "poison")
		var ran atomic.Int64
		handler := func(msg *message.Message) error {
			ran.Add(1)
			if err := f.ApplyEffect(msg.Context(), msg.Metadata.Get("event_id")); err != nil {
				return err
			}
			conformance.MarkHandled(msg)
			return nil
		}
		pq, err := wmw.PoisonQueueWithFilter(poison, "poison", func(err error) bool {
			return errors.Is(err, middleware.ErrNoMessageID)
		})
		if err != nil {
			t.Fatal(err)
		}
		// Two messages with different UUIDs but one event id, then one
		// without the field.
		a := message.NewMessage(watermill.NewUUID(), nil)
		a.Metadata.Set("event_id", "evt-1")
		b := message.NewMessage(watermill.NewUUID(), nil)
		b.Metadata.Set("event_id", "evt-1")
		noID := message.NewMessage(watermill.NewUUID(), nil)
		for _, m := range []*message.Message{a, b, noID} {
			conformance.PublishCopies(t, gc, "orders", m, 1)
		}
		conformance.StartRouter(t, func(r *message.Router) {
			r.AddMiddleware(pq, f.Middleware("billing", func(c *middleware.InboxConfig) {
				c.MessageID = middleware.MetadataID("event_id")
			}))
			r.AddConsumerHandler("apply", "orders", gc, handler)
		})
		poisoned := nextPoisoned()
		if poisoned.UUID != noID.UUID || !strings.Contains(poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), `"event_id"`) {
			t.Fatalf("poisoned %s (reason %q), want %s with a reason naming the field", poisoned.UUID, poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), noID.UUID)
		}
		f.WaitDeliveries(2)
		if ran.Load() != 1 || f.Duplicates() != 1 {
			t.Fatalf("handler ran %d times, duplicates %d; want 1 and 1", ran.Load(), f.Duplicates())
		}
		if got := f.Effects(); len(got) != 1 || got["evt-1"] != 1 {
			t.Fatalf("effects %v", got)
		}
		if rows := f.InboxRows(); len(rows) != 1 || rows[0] != "billing/apply|evt-1" {
			t.Fatalf("inbox rows %v", rows)
		}
	})

	// Without a poison queue, a message without an id is an error (the
	// router nacks it) and the handler never runs.
	t.Run("NoIDIsAnError", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		var ran bool
		h := func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil }
		for _, c := range []struct {
			name string
			id   func(*message.Message) (string, error)
			msg  *message.Message
		}{
			{"MissingMetadata", middleware.MetadataID("event_id"), message.NewMessage(watermill.NewUUID(), nil)},
			{"EmptyUUID", nil, message.NewMessage("", nil)},
			{"InvalidUTF8", func(*message.Message) (string, error) { return "\xff", nil }, message.NewMessage(watermill.NewUUID(), nil)},
		} {
			mw := f.Middleware("billing", func(cfg *middleware.InboxConfig) { cfg.MessageID = c.id })
			_, err := mw(h)(c.msg)
			if !errors.Is(err, middleware.ErrNoMessageID) {
				t.Errorf("%s: want ErrNoMessageID, got %v", c.name, err)
			}
		}
		if ran {
			t.Fatal("handler ran for a message without an id")
		}
	})

	// The handler reaches the driver transaction with one call, and the
	// other driver's accessor says what is wrong.
	t.Run("HandlerGetsDriverTx", func(t *testing.T) {
		t.Parallel()
		for _, driver := range inboxDrivers {
			f := newInboxFixtureFor(t, driver)
			var pgxErr, stdErr error
			_, err := f.Middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
				_, pgxErr = pgxv5.TxFromContext(msg.Context())
				_, stdErr = stdsql.TxFromContext(msg.Context())
				return nil, nil
			})(message.NewMessage(watermill.NewUUID(), nil))
			if err != nil {
				t.Fatal(err)
			}
			right, wrong := pgxErr, stdErr
			if driver == "database-sql" {
				right, wrong = stdErr, pgxErr
			}
			if right != nil || !errors.Is(wrong, sqladapters.ErrWrongTxType) {
				t.Fatalf("%s: own accessor %v, other accessor %v (want ErrWrongTxType)", driver, right, wrong)
			}
		}
	})
}
