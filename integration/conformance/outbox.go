package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// Outbox runs the outbox publisher suite for every transaction source.
func Outbox(t *testing.T, env Env) {
	for _, src := range env.Sources {
		t.Run(src.Name, func(t *testing.T) {
			outboxSuite(t, env, src)
		})
	}
	t.Run("MissingTable", func(t *testing.T) {
		if env.NewUnmigratedDialect == nil {
			t.Skip("no unmigrated dialect")
		}
		src := env.Sources[0]
		d := env.NewUnmigratedDialect(t)
		ctx := context.Background()
		tx := src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		pub := newPub(t, tx, d)
		err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("x")))
		if !errors.Is(err, sqladapters.ErrMissingTable) {
			t.Fatalf("want ErrMissingTable, got %v", err)
		}
		if !strings.Contains(err.Error(), "sqladapters.Migrate") {
			t.Fatalf("error does not say how to migrate: %v", err)
		}
	})
}

func newPub(t testing.TB, tx sqladapters.Tx, d sqladapters.Dialect) *forwarder.Publisher {
	t.Helper()
	p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func count(t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect) int {
	t.Helper()
	return len(ReadPending(t, ctx, env.DB, d))
}

func commit(t testing.TB, ctx context.Context, tx sqladapters.Tx) {
	t.Helper()
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func outboxSuite(t *testing.T, env Env, src TxSource) {
	ctx := context.Background()

	t.Run("RollbackLeavesNoRow", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		if err := pub.Publish("orders", message.NewMessage(watermill.NewUUID(), []byte("a")), message.NewMessage(watermill.NewUUID(), []byte("b"))); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if n := count(t, ctx, env, d); n != 0 {
			t.Fatalf("rolled back publish left %d rows", n)
		}
	})

	t.Run("CommitKeepsEveryField", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		binary := []byte{0x00, 0xff, 0xfe, 'x', 0x00, 0x80}
		m1 := message.NewMessage(watermill.NewUUID(), binary)
		m1.Metadata.Set(forwarder.DefaultKeyMetadataField, "customer-7")
		m1.Metadata.Set("trace", `{"quoted": "json\" inside"}`)
		m1.Metadata.Set("unicode", "żółć ✓")
		m2 := message.NewMessage("not-a-uuid: any string", []byte(`{"json":true}`))
		m3 := message.NewMessage(watermill.NewUUID(), nil)
		if err := pub.Publish("orders.v1", m1, m2, m3); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 3 {
			t.Fatalf("want 3 rows, got %d", len(rows))
		}
		for i, m := range []*message.Message{m1, m2, m3} {
			r := rows[i]
			if r.UUID != m.UUID || r.Topic != "orders.v1" || !bytes.Equal(r.Payload, m.Payload) {
				t.Fatalf("row %d = %+v, want uuid %s payload %q", i, r, m.UUID, m.Payload)
			}
			if len(r.Metadata) != len(m.Metadata) {
				t.Fatalf("row %d metadata %v, want %v", i, r.Metadata, m.Metadata)
			}
			for k, v := range m.Metadata {
				if r.Metadata[k] != v {
					t.Fatalf("row %d metadata %q = %q, want %q", i, k, r.Metadata[k], v)
				}
			}
			if r.Attempts != 0 {
				t.Fatalf("row %d attempts %d", i, r.Attempts)
			}
		}
		if rows[0].Key != "customer-7" || rows[1].Key != "" {
			t.Fatalf("keys %q %q", rows[0].Key, rows[1].Key)
		}
		if !(rows[0].ID < rows[1].ID && rows[1].ID < rows[2].ID) {
			t.Fatalf("ids not in publish order: %d %d %d", rows[0].ID, rows[1].ID, rows[2].ID)
		}
	})

	t.Run("PublishNothingIsNoop", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		if err := pub.Publish("orders"); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		if n := count(t, ctx, env, d); n != 0 {
			t.Fatalf("%d rows", n)
		}
	})

	t.Run("ThousandMessagesInOneCall", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		msgs := make([]*message.Message, 1000)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("m-%04d", i), []byte(fmt.Sprint(i)))
			msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprint("k", i%10))
		}
		if err := pub.Publish("bulk", msgs...); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 1000 {
			t.Fatalf("want 1000 rows, got %d", len(rows))
		}
		for i, r := range rows {
			if r.UUID != msgs[i].UUID || string(r.Payload) != fmt.Sprint(i) || r.Key != fmt.Sprint("k", i%10) {
				t.Fatalf("row %d = %s %q %q", i, r.UUID, r.Payload, r.Key)
			}
		}
	})

	t.Run("ConcurrentTransactions", func(t *testing.T) {
		if src.Sequential {
			t.Skip("source runs one transaction at a time")
		}
		d := env.NewDialect(t)
		const txs, per = 16, 5
		var wg sync.WaitGroup
		errs := make(chan error, txs)
		for i := range txs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tx, err := src.Begin(ctx)
				if err != nil {
					errs <- err
					return
				}
				pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
				if err == nil {
					for j := range per {
						if err = pub.Publish("c", message.NewMessage(fmt.Sprintf("%d-%d", i, j), nil)); err != nil {
							break
						}
					}
				}
				if err != nil {
					sqladapters.Rollback(tx)
					errs <- err
					return
				}
				// Every other transaction rolls back.
				if i%2 == 1 {
					errs <- tx.Rollback(ctx)
					return
				}
				errs <- tx.Commit(ctx)
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != txs/2*per {
			t.Fatalf("want %d rows from the committed transactions, got %d", txs/2*per, len(rows))
		}
		seen := map[string]bool{}
		for _, r := range rows {
			var i, j int
			fmt.Sscanf(r.UUID, "%d-%d", &i, &j)
			if i%2 == 1 || seen[r.UUID] {
				t.Fatalf("unexpected row %s", r.UUID)
			}
			seen[r.UUID] = true
		}
	})

	t.Run("ContextPublisher", func(t *testing.T) {
		d := env.NewDialect(t)
		pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		// No transaction in the context: an error, never an autocommit.
		err = pub.Publish("ctx", message.NewMessage(watermill.NewUUID(), nil))
		if !errors.Is(err, forwarder.ErrNoTx) {
			t.Fatalf("want ErrNoTx, got %v", err)
		}
		tx := src.MustBegin(t, ctx)
		m := message.NewMessage(watermill.NewUUID(), []byte("in tx"))
		m.SetContext(sqladapters.WithTx(ctx, tx))
		if err := pub.Publish("ctx", m); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 1 || rows[0].UUID != m.UUID {
			t.Fatalf("rows %+v", rows)
		}
	})

	t.Run("CQRSEventBus", func(t *testing.T) {
		d := env.NewDialect(t)
		outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		bus, err := cqrs.NewEventBusWithConfig(outbox, cqrs.EventBusConfig{
			GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) { return "events." + p.EventName, nil },
			Marshaler:            cqrs.JSONMarshaler{},
		})
		if err != nil {
			t.Fatal(err)
		}
		type OrderPlaced struct{ ID string }
		// Rolled back: the event is gone with the transaction.
		tx := src.MustBegin(t, ctx)
		if err := bus.Publish(sqladapters.WithTx(ctx, tx), &OrderPlaced{ID: "rolled-back"}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// Committed: exactly one row, on the bus's topic, with the event.
		tx = src.MustBegin(t, ctx)
		if err := bus.Publish(sqladapters.WithTx(ctx, tx), &OrderPlaced{ID: "o-1"}); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 1 || rows[0].Topic != "events.conformance.OrderPlaced" || !bytes.Contains(rows[0].Payload, []byte(`"o-1"`)) {
			t.Fatalf("rows %+v", rows)
		}
		// Without a transaction in the context the bus fails; nothing is written.
		if err := bus.Publish(ctx, &OrderPlaced{ID: "no-tx"}); !errors.Is(err, forwarder.ErrNoTx) {
			t.Fatalf("want ErrNoTx, got %v", err)
		}
	})

	t.Run("FinishedTx", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		commit(t, ctx, tx)
		pub := newPub(t, tx, d)
		err := pub.Publish("done", message.NewMessage(watermill.NewUUID(), nil))
		if !errors.Is(err, sqladapters.ErrTxDone) {
			t.Fatalf("want ErrTxDone, got %v", err)
		}
		if n := count(t, ctx, env, d); n != 0 {
			t.Fatalf("%d rows", n)
		}
	})

	t.Run("BadMessages", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d, MaxPayloadBytes: 16})
		if err != nil {
			t.Fatal(err)
		}
		good := message.NewMessage(watermill.NewUUID(), nil)
		badMeta := message.NewMessage(watermill.NewUUID(), nil)
		badMeta.Metadata.Set("k", string([]byte{0xff, 0xfe}))
		cases := map[string][]*message.Message{
			"nil message":        {good, nil},
			"non-UTF-8 metadata": {good, badMeta},
			"empty UUID":         {message.NewMessage("", nil)},
			"oversized payload":  {message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("x"), 17))},
		}
		for name, msgs := range cases {
			if err := pub.Publish("bad", msgs...); !errors.Is(err, forwarder.ErrInvalidMessage) {
				t.Fatalf("%s: want ErrInvalidMessage, got %v", name, err)
			}
		}
		if err := pub.Publish("", good); !errors.Is(err, forwarder.ErrInvalidMessage) {
			t.Fatalf("empty topic: want ErrInvalidMessage, got %v", err)
		}
		commit(t, ctx, tx)
		// A rejected call writes nothing, not even its valid messages.
		if n := count(t, ctx, env, d); n != 0 {
			t.Fatalf("%d rows after rejected publishes", n)
		}
	})
}
