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
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// newInboxGoChannel returns a persistent GoChannel, closed after the test
// (after routers started later, whose cleanups run first).
func newInboxGoChannel(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = gc.Close() })
	return gc
}

func publishCopies(t *testing.T, pub message.Publisher, topic string, msg *message.Message, n int) {
	t.Helper()
	for range n {
		if err := pub.Publish(topic, msg.Copy()); err != nil {
			t.Fatal(err)
		}
	}
}

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
		case <-time.After(inboxWaitTimeout):
			t.Fatalf("no message on %s", topic)
			return nil
		}
	}
}

func TestInboxMiddleware(t *testing.T) {
	t.Parallel()

	for _, driver := range inboxDrivers {
		t.Run("DeliveredThreeTimes/"+driver, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixtureFor(t, driver)
			gc := newInboxGoChannel(t)
			msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
			publishCopies(t, gc, "orders", msg, 3)
			startInboxRouter(t, func(r *message.Router) {
				r.AddMiddleware(f.middleware("billing"))
				r.AddConsumerHandler("apply", "orders", gc, f.effectHandler)
			})
			f.waitDeliveries(3)
			if h, d := f.handled.Load(), f.dups.Load(); h != 1 || d != 2 {
				t.Fatalf("handled %d, duplicates %d; want 1 and 2", h, d)
			}
			if n := f.effect(msg.UUID); n != 1 {
				t.Fatalf("effect applied %d times", n)
			}
			// The consumer is scoped to the router handler.
			if rows := f.inboxRows(); len(rows) != 1 || rows[0] != "billing/apply|"+msg.UUID {
				t.Fatalf("inbox rows %v", rows)
			}
		})

		t.Run("FailedAttemptLeavesNothing/"+driver, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixtureFor(t, driver)
			gc := newInboxGoChannel(t)
			fl := newFailer()
			var leftovers atomic.Int64
			leftovers.Store(-1)
			handler := func(msg *message.Message) error {
				n := fl.next(msg.UUID)
				if n == 2 {
					// What the failed first attempt left committed.
					var c int64
					err := f.pool.QueryRow(f.ctx, `SELECT (SELECT count(*) FROM `+f.table("effects")+`) + (SELECT count(*) FROM `+f.d.InboxTable()+`)`).Scan(&c)
					if err != nil {
						return err
					}
					leftovers.Store(c)
				}
				if err := f.applyEffect(msg.Context(), msg.UUID); err != nil {
					return err
				}
				if n == 1 {
					return errInjected
				}
				markHandled(msg)
				return nil
			}
			msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
			publishCopies(t, gc, "orders", msg, 1)
			startInboxRouter(t, func(r *message.Router) {
				r.AddMiddleware(f.middleware("billing"))
				r.AddConsumerHandler("apply", "orders", gc, handler)
			})
			f.waitDeliveries(1)
			if got := leftovers.Load(); got != 0 {
				t.Fatalf("the failed attempt left %d rows (business + inbox)", got)
			}
			if n := f.effect(msg.UUID); n != 1 || fl.count(msg.UUID) != 2 {
				t.Fatalf("effect %d after %d attempts; want 1 after 2", n, fl.count(msg.UUID))
			}
			if rows := f.inboxRows(); len(rows) != 1 {
				t.Fatalf("inbox rows %v", rows)
			}
		})

		t.Run("PanicRollsBackAndPanicsAgain/"+driver, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixtureFor(t, driver)
			h := f.middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
				if err := f.applyEffect(msg.Context(), msg.UUID); err != nil {
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
			if n := f.effect(msg.UUID); n != 0 || len(f.inboxRows()) != 0 {
				t.Fatalf("panicking handler left effect %d and inbox rows %v", n, f.inboxRows())
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
		gc := newInboxGoChannel(t)
		poison := newInboxGoChannel(t)
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
			var c int
			if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM `+f.table("effects")+` WHERE id = $1`, msg.UUID).Scan(&c); err != nil {
				return err
			}
			if c != 0 {
				dirtyStarts.Add(1)
			}
			if err := f.applyEffect(msg.Context(), msg.UUID); err != nil {
				return err
			}
			switch msg.Metadata.Get("mode") {
			case "flaky":
				switch n {
				case 1:
					return errInjected
				case 2:
					panic("injected panic")
				}
			case "poison":
				return errInjected
			}
			markHandled(msg)
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
		publishCopies(t, gc, "orders", flaky, 1)
		publishCopies(t, gc, "orders", bad, 1)
		startInboxRouter(t, func(r *message.Router) {
			r.AddMiddleware(
				pq,
				wmw.Retry{MaxRetries: 2, InitialInterval: time.Millisecond}.Middleware,
				wmw.Recoverer,
				f.middleware("billing"),
			)
			r.AddConsumerHandler("apply", "orders", gc, handler)
		})
		poisoned := nextPoisoned()
		if poisoned.UUID != bad.UUID || !strings.Contains(poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), errInjected.Error()) {
			t.Fatalf("poisoned %s (reason %q), want %s", poisoned.UUID, poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), bad.UUID)
		}
		f.waitDeliveries(1)
		// A redelivery of the message that finally succeeded is skipped.
		publishCopies(t, gc, "orders", flaky, 1)
		f.waitDeliveries(2)

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
		if got := f.effects(); len(got) != 1 || got[flaky.UUID] != 1 {
			t.Fatalf("effects %v, want only %s once", got, flaky.UUID)
		}
		if rows := f.inboxRows(); len(rows) != 1 || !strings.HasSuffix(rows[0], flaky.UUID) {
			t.Fatalf("inbox rows %v", rows)
		}
		if f.dups.Load() != 1 {
			t.Fatalf("duplicates %d, want 1", f.dups.Load())
		}
	})

	t.Run("MetadataID", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		gc := newInboxGoChannel(t)
		poison := newInboxGoChannel(t)
		nextPoisoned := subscribeOne(t, poison, "poison")
		var ran atomic.Int64
		handler := func(msg *message.Message) error {
			ran.Add(1)
			if err := f.applyEffect(msg.Context(), msg.Metadata.Get("event_id")); err != nil {
				return err
			}
			markHandled(msg)
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
			publishCopies(t, gc, "orders", m, 1)
		}
		startInboxRouter(t, func(r *message.Router) {
			r.AddMiddleware(pq, f.middleware("billing", func(c *middleware.InboxConfig) {
				c.MessageID = middleware.MetadataID("event_id")
			}))
			r.AddConsumerHandler("apply", "orders", gc, handler)
		})
		poisoned := nextPoisoned()
		if poisoned.UUID != noID.UUID || !strings.Contains(poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), `"event_id"`) {
			t.Fatalf("poisoned %s (reason %q), want %s with a reason naming the field", poisoned.UUID, poisoned.Metadata.Get(wmw.ReasonForPoisonedKey), noID.UUID)
		}
		f.waitDeliveries(2)
		if ran.Load() != 1 || f.dups.Load() != 1 {
			t.Fatalf("handler ran %d times, duplicates %d; want 1 and 1", ran.Load(), f.dups.Load())
		}
		if got := f.effects(); len(got) != 1 || got["evt-1"] != 1 {
			t.Fatalf("effects %v", got)
		}
		if rows := f.inboxRows(); len(rows) != 1 || rows[0] != "billing/apply|evt-1" {
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
			mw := f.middleware("billing", func(cfg *middleware.InboxConfig) { cfg.MessageID = c.id })
			_, err := mw(h)(c.msg)
			if !errors.Is(err, middleware.ErrNoMessageID) {
				t.Errorf("%s: want ErrNoMessageID, got %v", c.name, err)
			}
		}
		if ran {
			t.Fatal("handler ran for a message without an id")
		}
	})

	t.Run("MissingInboxTable", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		f.d = postgres.MustNew(postgres.Options{Schema: f.d.Schema(), InboxTable: "no_such_inbox"})
		var ran bool
		_, err := f.middleware("billing")(func(*message.Message) ([]*message.Message, error) {
			ran = true
			return nil, nil
		})(message.NewMessage(watermill.NewUUID(), nil))
		if !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
			t.Fatalf("want ErrMissingTable saying how to migrate, got %v", err)
		}
		if ran {
			t.Fatal("handler ran without an inbox table")
		}
	})

	for _, driver := range inboxDrivers {
		t.Run("ConcurrentDuplicatesTwoRouters/"+driver, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixtureFor(t, driver)
			gc := newInboxGoChannel(t)
			var failures atomic.Int64 // errors returned to either router
			var overlaps atomic.Int64 // barrier messages whose twin waited on the inbox key
			observe := func(h message.HandlerFunc) message.HandlerFunc {
				return func(msg *message.Message) ([]*message.Message, error) {
					out, err := h(msg)
					if err != nil {
						failures.Add(1)
					}
					return out, err
				}
			}
			handler := func(msg *message.Message) error {
				if msg.Metadata.Get("barrier") == "1" {
					// Hold this delivery's transaction until the other router's
					// delivery of the same message blocks on the inbox key.
					deadline := time.Now().Add(inboxWaitTimeout)
					for time.Now().Before(deadline) {
						var n int
						if err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
							"INSERT INTO "+f.d.InboxTable()+"%").Scan(&n); err != nil {
							return err
						}
						if n > 0 {
							overlaps.Add(1)
							break
						}
						time.Sleep(2 * time.Millisecond)
					}
				}
				return f.effectHandler(msg)
			}
			for range 2 {
				startInboxRouter(t, func(r *message.Router) {
					r.AddMiddleware(observe, f.middleware("billing"))
					r.AddConsumerHandler("apply", "orders", gc, handler)
				})
			}
			// GoChannel gives every subscriber every message: both routers get
			// each one at the same time.
			barrier := message.NewMessage(watermill.NewUUID(), nil)
			barrier.Metadata.Set("barrier", "1")
			publishCopies(t, gc, "orders", barrier, 1)
			f.waitDeliveries(2)
			if overlaps.Load() != 1 {
				t.Fatal("the two deliveries did not overlap")
			}
			const n = 50
			for range n {
				publishCopies(t, gc, "orders", message.NewMessage(watermill.NewUUID(), nil), 1)
			}
			f.waitDeliveries(2 * (n + 1))
			if failures.Load() != 0 {
				t.Fatalf("%d deliveries failed", failures.Load())
			}
			if h, d := f.handled.Load(), f.dups.Load(); h != n+1 || d != n+1 {
				t.Fatalf("handled %d, duplicates %d; want %d each", h, d, n+1)
			}
			for id, c := range f.effects() {
				if c != 1 {
					t.Fatalf("effect of %s applied %d times", id, c)
				}
			}
			if got := len(f.effects()); got != n+1 {
				t.Fatalf("%d effects, want %d", got, n+1)
			}
		})
	}

	// The handler reaches the driver transaction with one call, and the
	// other driver's accessor says what is wrong.
	t.Run("HandlerGetsDriverTx", func(t *testing.T) {
		t.Parallel()
		for _, driver := range inboxDrivers {
			f := newInboxFixtureFor(t, driver)
			var pgxErr, stdErr error
			_, err := f.middleware("billing")(func(msg *message.Message) ([]*message.Message, error) {
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

	t.Run("Config", func(t *testing.T) {
		t.Parallel()
		f := newInboxFixture(t)
		valid := middleware.InboxConfig{DB: f.db, Dialect: f.d, Consumer: "billing"}
		for _, c := range []struct {
			name  string
			edit  func(*middleware.InboxConfig)
			field string
		}{
			{"NilDB", func(c *middleware.InboxConfig) { c.DB = nil }, "DB"},
			{"NilDialect", func(c *middleware.InboxConfig) { c.Dialect = nil }, "Dialect"},
			{"EmptyConsumer", func(c *middleware.InboxConfig) { c.Consumer = "" }, "Consumer"},
			{"InvalidConsumer", func(c *middleware.InboxConfig) { c.Consumer = "bill\xffing" }, "Consumer"},
			{"ReadOnly", func(c *middleware.InboxConfig) { c.TxOptions.ReadOnly = true }, "TxOptions.ReadOnly"},
			{"NegativeCommitTimeout", func(c *middleware.InboxConfig) { c.CommitTimeout = -time.Second }, "CommitTimeout"},
		} {
			cfg := valid
			c.edit(&cfg)
			_, err := middleware.NewInbox(cfg)
			if !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "InboxConfig."+c.field) {
				t.Errorf("%s: want ErrInvalidConfig naming %s, got %v", c.name, c.field, err)
			}
		}
		if _, err := middleware.NewInbox(valid); err != nil {
			t.Fatalf("valid config rejected: %v", err)
		}
	})
}
