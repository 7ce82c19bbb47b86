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

	// A NUL byte fits some databases' text and not others' (Postgres); the
	// publisher refuses it everywhere, naming the field, before the
	// database sees it, so the transaction stays usable.
	t.Run("NULBytesRefused", func(t *testing.T) {
		d := env.NewDialect(t)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		withMeta := func(k, v string) *message.Message {
			m := message.NewMessage(watermill.NewUUID(), []byte("p"))
			m.Metadata.Set(k, v)
			return m
		}
		cases := []struct {
			name, topic string
			msg         *message.Message
			want        string
		}{
			{"topic", "orders\x00v1", message.NewMessage(watermill.NewUUID(), nil), "topic"},
			{"UUID", "orders", message.NewMessage("id\x001", nil), "UUID"},
			{"metadata key", "orders", withMeta("tr\x00ce", "v"), "metadata key"},
			{"metadata value", "orders", withMeta("trace", "v\x00"), `metadata "trace" value`},
			{"ordering key", "orders", withMeta(forwarder.DefaultKeyMetadataField, "customer\x007"), "ordering key"},
		}
		var good []string
		for _, c := range cases {
			err := pub.Publish(c.topic, c.msg)
			if !errors.Is(err, forwarder.ErrInvalidMessage) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "NUL") {
				t.Fatalf("NUL in the %s: want ErrInvalidMessage naming the %s and the NUL byte, got %v", c.name, c.want, err)
			}
			// The transaction is still usable.
			m := message.NewMessage(watermill.NewUUID(), []byte("after "+c.name))
			if err := pub.Publish("orders", m); err != nil {
				t.Fatalf("publish after refusing a NUL in the %s: %v", c.name, err)
			}
			good = append(good, m.UUID)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != len(good) {
			t.Fatalf("%d rows, want the %d published after the refusals", len(rows), len(good))
		}
		for i, r := range rows {
			if r.UUID != good[i] {
				t.Fatalf("row %d is %s, want %s", i, r.UUID, good[i])
			}
		}
	})

	// A call that fails writes none of its messages, also when it took
	// several statements and the database refused only the last one, and
	// the transaction goes on: what else it holds commits.
	t.Run("FailedCallWritesNothing", func(t *testing.T) {
		d := env.NewDialect(t)
		const refused = "refused-by-the-database"
		refuseUUID(t, ctx, env, d, refused)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		first := message.NewMessage(watermill.NewUUID(), []byte("first"))
		if err := pub.Publish("orders", first); err != nil {
			t.Fatal(err)
		}
		// The publisher refuses the last message before writing any.
		msgs := make([]*message.Message, 301)
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), bytes.Repeat([]byte("x"), 4<<10))
		}
		msgs[300].UUID = "nul\x00"
		if err := pub.Publish("orders", msgs...); !errors.Is(err, forwarder.ErrInvalidMessage) {
			t.Fatalf("want ErrInvalidMessage, got %v", err)
		}
		// The database refuses the last message of a call large enough
		// to take several INSERT statements on every database (at most
		// 5,000 rows each on Postgres and SQLite, 10,000 on MySQL).
		msgs = make([]*message.Message, 10001)
		for i := range msgs {
			msgs[i] = message.NewMessage(fmt.Sprintf("bulk-%05d", i), []byte("x"))
		}
		msgs[len(msgs)-1].UUID = refused
		if err := pub.Publish("orders", msgs...); err == nil {
			t.Fatal("the database accepted the message it must refuse")
		}
		last := message.NewMessage(watermill.NewUUID(), []byte("last"))
		if err := pub.Publish("orders", last); err != nil {
			t.Fatalf("publish after a failed call: %v", err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 2 || rows[0].UUID != first.UUID || rows[1].UUID != last.UUID {
			t.Fatalf("%d rows; want only the 2 messages of the calls that succeeded", len(rows))
		}
	})

	// The largest payload the publisher accepts is stored byte for byte,
	// even when every byte needs escaping; one byte more is refused with an
	// error that names the limit.
	t.Run("PayloadAtTheLimit", func(t *testing.T) {
		d := env.NewDialect(t)
		id := watermill.NewUUID()
		limit, name := PayloadLimit(d, "limit", id)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		over := message.NewMessage(watermill.NewUUID(), make([]byte, limit+1))
		if err := pub.Publish("limit", over); !errors.Is(err, forwarder.ErrInvalidMessage) || !strings.Contains(err.Error(), name) {
			t.Fatalf("payload of %d bytes: want ErrInvalidMessage naming %s, got %v", limit+1, name, err)
		}
		at := message.NewMessage(id, make([]byte, limit))
		if err := pub.Publish("limit", at); err != nil {
			t.Fatalf("payload of %d bytes (%s): %v", limit, name, err)
		}
		commit(t, ctx, tx)
		rows := ReadPending(t, ctx, env.DB, d)
		if len(rows) != 1 || rows[0].UUID != id || !bytes.Equal(rows[0].Payload, at.Payload) {
			t.Fatalf("%d rows; want the %d-byte payload stored intact", len(rows), limit)
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

// PayloadLimit returns the largest payload the default publisher accepts
// for a message of topic and uuid without metadata on d, and the name and
// value of the limit that sets it, as its errors spell them.
func PayloadLimit(d sqladapters.Dialect, topic, uuid string) (int, string) {
	limit, name := forwarder.DefaultMaxPayloadBytes, fmt.Sprint("MaxPayloadBytes ", forwarder.DefaultMaxPayloadBytes)
	if m := d.MaxMessageBytes(); m > 0 {
		if room := m - len(topic) - len(uuid) - len("{}"); room < limit {
			limit, name = room, fmt.Sprint("MaxMessageBytes ", m)
		}
	}
	return limit, name
}

// refuseUUID makes the database itself refuse an outbox row with uuid: a
// stand-in for a failure the publisher cannot foresee, such as a lock wait
// timeout.
func refuseUUID(t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect, uuid string) {
	t.Helper()
	stmt := `ALTER TABLE ` + d.OutboxTable() + ` ADD CHECK (uuid <> '` + uuid + `')`
	if d.Name() == "sqlite" {
		// SQLite cannot add a constraint to a table; a trigger refuses.
		trigger := `"` + strings.Trim(d.OutboxTable(), `"`) + `_refuse"`
		stmt = `CREATE TRIGGER ` + trigger + ` BEFORE INSERT ON ` + d.OutboxTable() +
			` WHEN NEW.uuid = '` + uuid + `' BEGIN SELECT RAISE(ABORT, 'refused'); END`
	}
	if _, err := env.DB.Exec(ctx, stmt); err != nil {
		t.Fatalf("make the database refuse %s: %v", uuid, err)
	}
}
