package conformance

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/internal/testlog"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// Recorder is a destination publisher that keeps what it was given. It can
// be told to reject messages.
type Recorder struct {
	mu     sync.Mutex
	msgs   []Delivered
	byUUID map[string]int
	// Reject, when set, decides whether to fail a publish.
	Reject func(topic string, msg *message.Message) error
	closed bool
}

// Delivered is one message as the destination received it.
type Delivered struct {
	Topic    string
	UUID     string
	Payload  []byte
	Metadata message.Metadata
	At       time.Time
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{byUUID: map[string]int{}} }

// Publish records msgs unless Reject fails one.
func (r *Recorder) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		r.mu.Lock()
		reject := r.Reject
		r.mu.Unlock()
		if reject != nil {
			if err := reject(topic, m); err != nil {
				return err
			}
		}
		r.mu.Lock()
		r.msgs = append(r.msgs, Delivered{Topic: topic, UUID: m.UUID, Payload: m.Payload, Metadata: m.Metadata, At: time.Now()})
		r.byUUID[m.UUID]++
		r.mu.Unlock()
	}
	return nil
}

// Close implements message.Publisher.
func (r *Recorder) Close() error { r.closed = true; return nil }

// SetReject replaces the reject function.
func (r *Recorder) SetReject(f func(topic string, msg *message.Message) error) {
	r.mu.Lock()
	r.Reject = f
	r.mu.Unlock()
}

// Messages returns a copy of everything delivered, in delivery order.
func (r *Recorder) Messages() []Delivered {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Delivered(nil), r.msgs...)
}

// has tells whether a message of key (under the default key field) with
// metadata seq arrived.
func (r *Recorder) has(key string, seq int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m.Metadata.Get(forwarder.DefaultKeyMetadataField) == key && m.Metadata.Get("seq") == strconv.Itoa(seq) {
			return true
		}
	}
	return false
}

// Distinct returns how many different UUIDs arrived.
func (r *Recorder) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byUUID)
}

// WaitFor waits until n distinct UUIDs arrived.
func (r *Recorder) WaitFor(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for r.Distinct() < n {
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %d of %d messages arrived", timeout, r.Distinct(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// CheckKeyOrder fails unless, for every key, the first delivery of each
// message follows the "seq" metadata order, and no seq is missing.
func CheckKeyOrder(t testing.TB, msgs []Delivered, keyField string) {
	t.Helper()
	last := map[string]int{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[m.UUID] {
			continue // a redelivery; order is about first arrivals
		}
		seen[m.UUID] = true
		key := m.Metadata.Get(keyField)
		seq, err := strconv.Atoi(m.Metadata.Get("seq"))
		if err != nil {
			t.Fatalf("message %s without seq", m.UUID)
		}
		if prev, ok := last[key]; ok && seq <= prev {
			t.Fatalf("key %s: seq %d arrived after %d", key, seq, prev)
		}
		last[key] = seq
	}
}

// WriteKeyed commits n messages through the outbox in transactions of
// perTx messages each, from writers goroutines; message i of key k has
// metadata seq i. Keys are assigned so that each writer owns whole keys,
// which keeps each key's commit order equal to its seq order.
func WriteKeyed(t testing.TB, ctx context.Context, src TxSource, d sqladapters.Dialect, topic string, keys, perKey, perTx, writers int) {
	t.Helper()
	WriteKeyedIn(t, ctx, src, d, forwarder.DefaultKeyMetadataField, topic, keys, perKey, perTx, writers)
}

// WriteKeyedIn is WriteKeyed with the key in the metadata field keyField,
// the publisher's PublisherConfig.KeyMetadataField: message i of key k has
// metadata keyField "key-k" and seq i.
func WriteKeyedIn(t testing.TB, ctx context.Context, src TxSource, d sqladapters.Dialect, keyField, topic string, keys, perKey, perTx, writers int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; seq < perKey; seq += perTx {
				var msgs []*message.Message
				for k := w; k < keys; k += writers {
					for s := seq; s < min(seq+perTx, perKey); s++ {
						m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d-%d", k, s)))
						m.Metadata.Set(keyField, fmt.Sprintf("key-%d", k))
						m.Metadata.Set("seq", strconv.Itoa(s))
						msgs = append(msgs, m)
					}
				}
				if err := publishCommitted(ctx, src, forwarder.PublisherConfig{Dialect: d, KeyMetadataField: keyField}, topic, msgs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// publishCommitted publishes msgs in one transaction of src and commits
// it. It returns errors rather than failing a test, for WriteKeyed's
// goroutines.
func publishCommitted(ctx context.Context, src TxSource, cfg forwarder.PublisherConfig, topic string, msgs []*message.Message) error {
	tx, err := src.Begin(ctx)
	if err != nil {
		return err
	}
	pub, err := forwarder.NewPublisher(tx, cfg)
	if err == nil {
		err = pub.Publish(topic, msgs...)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// StartForwarder runs a forwarder until the test ends.
func StartForwarder(t testing.TB, cfg forwarder.Config) *forwarder.Forwarder {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testlog.Logger(t)
	}
	f, err := forwarder.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(context.Background()) }()
	select {
	case <-f.Running():
	case err := <-errc:
		t.Fatalf("forwarder stopped at start: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("forwarder did not start within 20s")
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("close forwarder: %v", err)
		}
		if err := <-errc; err != nil {
			t.Errorf("forwarder run: %v", err)
		}
	})
	return f
}

// Forwarder runs the forwarder suite: delivery, per-key order with several
// instances, retries, dead letters, audit mode, graceful close, bad
// configuration and delayed messages.
func Forwarder(t *testing.T, env Env) {
	ctx := context.Background()
	src := env.Sources[0]
	fast := func(t testing.TB, d sqladapters.Dialect, dest message.Publisher) forwarder.Config {
		cfg := forwarder.Config{
			DB:          env.DB,
			Dialect:     d,
			Destination: dest,
			Retry:       forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond},
			Source:      env.source(t, d),
			Logger:      testlog.Logger(t),
		}
		SetPollInterval(&cfg, 50*time.Millisecond)
		return cfg
	}

	t.Run("DeliversEverythingIntact", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		StartForwarder(t, fast(t, d, rec))
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		var sent []*message.Message
		for i := range 50 {
			m := message.NewMessage(watermill.NewUUID(), []byte{byte(i), 0x00, 0xff})
			m.Metadata.Set("i", strconv.Itoa(i))
			if i%2 == 0 {
				m.Metadata.Set(forwarder.DefaultKeyMetadataField, "k")
			}
			sent = append(sent, m)
		}
		if err := pub.Publish("topic-a", sent...); err != nil {
			t.Fatal(err)
		}
		commit(t, ctx, tx)
		rec.WaitFor(t, len(sent), 20*time.Second)
		got := map[string]Delivered{}
		for _, m := range rec.Messages() {
			got[m.UUID] = m
		}
		for _, m := range sent {
			g, ok := got[m.UUID]
			if !ok || g.Topic != "topic-a" || string(g.Payload) != string(m.Payload) || len(g.Metadata) != len(m.Metadata) {
				t.Fatalf("message %s arrived as %+v", m.UUID, g)
			}
			for k, v := range m.Metadata {
				if g.Metadata.Get(k) != v {
					t.Fatalf("metadata %s = %q, want %q", k, g.Metadata.Get(k), v)
				}
			}
		}
		waitEmpty(t, ctx, env, d)
	})

	t.Run("PerKeyOrderWithThreeInstances", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		var fs []*forwarder.Forwarder
		for range 3 {
			cfg := fast(t, d, rec)
			cfg.BatchSize = 200
			fs = append(fs, StartForwarder(t, cfg))
		}
		if env.polling() {
			WaitOwned(t, fs, 8, true)
		} else {
			WaitOwned(t, fs, 1, false)
		}
		const keys, perKey = 40, 50
		WriteKeyed(t, ctx, src, d, "ordered", keys, perKey, 5, 4)
		rec.WaitFor(t, keys*perKey, 60*time.Second)
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
		waitEmpty(t, ctx, env, d)
	})

	// Instances that start together share the partitions from their first
	// claim: none takes more than its share while the others are still
	// announcing themselves.
	t.Run("InstancesStartingTogetherSplitThePartitions", func(t *testing.T) {
		if !env.polling() {
			t.Skip("one reader streams from the slot")
		}
		d := env.NewDialect(t)
		rec := NewRecorder()
		const instances, partitions = 3, 16
		cfg := fast(t, d, rec)
		cfg.Source = forwarder.Polling{Partitions: partitions, LeaseTTL: time.Hour}
		SetPollInterval(&cfg, time.Second) // the first claim waits a quarter of it
		fs := make([]*forwarder.Forwarder, instances)
		for i := range fs {
			f, err := forwarder.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			fs[i] = f
		}
		for _, f := range fs {
			errc := make(chan error, 1)
			go func() { errc <- f.Run(ctx) }()
			t.Cleanup(func() {
				if err := f.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
				if err := <-errc; err != nil {
					t.Errorf("run: %v", err)
				}
			})
		}
		share := (partitions + instances - 1) / instances
		for i, f := range fs {
			if err := f.Ready(ctx); err != nil {
				t.Fatal(err)
			}
			if n := len(f.Partitions()); n > share {
				t.Fatalf("instance %d holds %d partitions at its start, more than its share of %d", i, n, share)
			}
		}
		WaitOwned(t, fs, partitions, true)
	})

	t.Run("FailingKeyWaitsAndKeepsOrder", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		var mu sync.Mutex
		failures := 0
		rec.SetReject(func(_ string, m *message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if m.Metadata.Get(forwarder.DefaultKeyMetadataField) == "bad" && m.Metadata.Get("seq") == "0" && failures < 3 {
				failures++
				return errors.New("destination refused (transient)")
			}
			return nil
		})
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		for _, key := range []string{"bad", "good"} {
			for s := range 10 {
				m := message.NewMessage(watermill.NewUUID(), nil)
				m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
				m.Metadata.Set("seq", strconv.Itoa(s))
				if err := pub.Publish("t", m); err != nil {
					t.Fatal(err)
				}
			}
		}
		commit(t, ctx, tx)
		StartForwarder(t, fast(t, d, rec))
		rec.WaitFor(t, 20, 20*time.Second)
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
		mu.Lock()
		if failures != 3 {
			t.Fatalf("head of key bad failed %d times, want 3", failures)
		}
		mu.Unlock()
	})

	t.Run("PoisonMessageIsDeadLettered", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		poison := watermill.NewUUID()
		rec.SetReject(func(_ string, m *message.Message) error {
			if m.UUID == poison {
				return errors.New("destination rejects this message: \xff bad bytes \x00")
			}
			return nil
		})
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		var total int
		for i := range 30 {
			uuid := watermill.NewUUID()
			if i == 0 {
				uuid = poison
			}
			m := message.NewMessage(uuid, nil)
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprint("key-", i%3))
			m.Metadata.Set("seq", strconv.Itoa(i))
			if err := pub.Publish("t", m); err != nil {
				t.Fatal(err)
			}
			total++
		}
		commit(t, ctx, tx)
		cfg := fast(t, d, rec)
		cfg.MaxAttempts = 3
		f := StartForwarder(t, cfg)
		// Everything but the poison message arrives, including the later
		// messages of the poison message's key once it is dead.
		rec.WaitFor(t, total-1, 30*time.Second)
		var dead []sqladapters.DeadLetter
		deadline := time.Now().Add(10 * time.Second)
		for len(dead) == 0 && time.Now().Before(deadline) {
			var err error
			if dead, err = deadLetters(ctx, env, d, 10); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(dead) != 1 || dead[0].UUID != poison || dead[0].Attempts != 3 || dead[0].LastError == "" {
			t.Fatalf("dead letters %+v", dead)
		}
		waitBacklog(t, ctx, env, d, backlog{Pending: 0, Dead: 1})
		// Requeued and accepted this time, it is delivered.
		rec.SetReject(nil)
		if n, err := requeue(ctx, env, d, dead[0].ID); err != nil || n != 1 {
			t.Fatalf("requeue: %d, %v", n, err)
		}
		rec.WaitFor(t, total, 20*time.Second)
		_ = f
		waitBacklog(t, ctx, env, d, backlog{})
	})

	// Ordering keys of any length: a key far longer than any index entry
	// keeps its order, is dead-lettered and requeued like a short one, and
	// reaches the destination whole. The second key differs from the first
	// in its last byte only, so only a comparison of whole keys tells them
	// apart.
	t.Run("LongKeys", func(t *testing.T) {
		for _, size := range []int{3 << 10, 70 << 10} {
			t.Run(fmt.Sprintf("%dKiB", size>>10), func(t *testing.T) {
				d := env.NewDialect(t)
				a := randomKey(t, size)
				b := a[:size-1] + "A"
				if b == a {
					b = a[:size-1] + "B"
				}
				field := forwarder.DefaultKeyMetadataField
				rec := NewRecorder()
				var mu sync.Mutex
				var transient int
				var lastPoisonTry time.Time
				rec.SetReject(func(_ string, m *message.Message) error {
					mu.Lock()
					defer mu.Unlock()
					key, seq := m.Metadata.Get(field), m.Metadata.Get("seq")
					switch {
					case key == a && seq == "0":
						lastPoisonTry = time.Now()
						return errors.New("destination rejects this message")
					case key == b && seq == "0" && transient < 2:
						transient++
						return errors.New("destination refused (transient)")
					}
					return nil
				})
				tx := src.MustBegin(t, ctx)
				pub := newPub(t, tx, d)
				uuids := map[string]string{}
				for s := range 4 {
					for _, key := range []string{a, b} {
						m := message.NewMessage(watermill.NewUUID(), []byte(strconv.Itoa(s)))
						m.Metadata.Set(field, key)
						m.Metadata.Set("seq", strconv.Itoa(s))
						uuids[m.UUID] = key
						if err := pub.Publish("long-keys", m); err != nil {
							t.Fatalf("publish with a %d-byte key: %v", size, err)
						}
					}
				}
				commit(t, ctx, tx)
				cfg := fast(t, d, rec)
				cfg.MaxAttempts = 3
				StartForwarder(t, cfg)
				// Everything but the poison message arrives; the second key
				// gets past its transient failures in order.
				rec.WaitFor(t, 7, 30*time.Second)
				dead := waitDeadLetters(t, ctx, env, d, 1)
				if dead[0].Key != a || dead[0].Attempts != 3 || dead[0].LastError == "" || uuids[dead[0].UUID] != a {
					t.Fatalf("dead letter: key of %d bytes (equal: %v), attempts %d, error %q", len(dead[0].Key), dead[0].Key == a, dead[0].Attempts, dead[0].LastError)
				}
				waitBacklog(t, ctx, env, d, backlog{Pending: 0, Dead: 1})
				msgs := rec.Messages()
				CheckKeyOrder(t, msgs, field)
				mu.Lock()
				if transient != 2 {
					t.Fatalf("the second key's head failed %d times, want 2", transient)
				}
				// The first key's later messages waited until its head was
				// dead-lettered.
				for _, m := range msgs {
					if m.Metadata.Get(field) == a && !m.At.After(lastPoisonTry) {
						t.Fatalf("message seq %s of the dead-lettered key arrived before its head's last attempt", m.Metadata.Get("seq"))
					}
					if m.Metadata.Get(field) != uuids[m.UUID] {
						t.Fatalf("message %s arrived with a key of %d bytes, want its %d-byte key", m.UUID, len(m.Metadata.Get(field)), size)
					}
				}
				mu.Unlock()
				// Requeued and accepted this time, it is delivered.
				rec.SetReject(nil)
				if n, err := requeue(ctx, env, d, dead[0].ID); err != nil || n != 1 {
					t.Fatalf("requeue: %d, %v", n, err)
				}
				rec.WaitFor(t, 8, 20*time.Second)
				waitBacklog(t, ctx, env, d, backlog{})
			})
		}
	})

	// The largest payload the publisher accepts reaches the destination
	// intact.
	t.Run("PayloadAtTheLimitIsForwarded", func(t *testing.T) {
		d := env.NewDialect(t)
		id := watermill.NewUUID()
		limit, _ := PayloadLimit(d, "limit", id)
		payload := make([]byte, limit)
		payload[0], payload[limit-1] = 'a', 'z'
		tx := src.MustBegin(t, ctx)
		if err := newPub(t, tx, d).Publish("limit", message.NewMessage(id, payload)); err != nil {
			t.Fatalf("payload of %d bytes: %v", limit, err)
		}
		commit(t, ctx, tx)
		rec := NewRecorder()
		StartForwarder(t, fast(t, d, rec))
		rec.WaitFor(t, 1, 30*time.Second)
		if got := rec.Messages()[0]; got.UUID != id || string(got.Payload) != string(payload) {
			t.Fatalf("message %s arrived with %d payload bytes, want %s with %d", got.UUID, len(got.Payload), id, limit)
		}
		waitEmpty(t, ctx, env, d)
	})

	// Different keys may share a key hash. A key backing off must hold back
	// only its own later rows, not those of a key with the same hash.
	t.Run("SharedKeyHashHoldsBackOnlyItsKey", func(t *testing.T) {
		d := env.NewDialect(t)
		rows := []sqladapters.OutboxMessage{
			{UUID: "a1", Key: "a", KeyHash: 7},
			{UUID: "a2", Key: "a", KeyHash: 7},
			{UUID: "x1", Key: "x", KeyHash: 7},
		}
		for i := range rows {
			rows[i].Topic, rows[i].Payload, rows[i].Metadata = "t", []byte{}, []byte("{}")
		}
		if err := d.InsertOutbox(ctx, env.DB, rows); err != nil {
			t.Fatal(err)
		}
		pending := ReadPending(t, ctx, env.DB, d)
		if len(pending) != 3 {
			t.Fatalf("%d rows pending, want 3", len(pending))
		}
		if _, err := d.RecordFailure(ctx, env.DB, sqladapters.Failure{ID: pending[0].ID, Attempts: 1, Error: "down", Backoff: time.Hour}); err != nil {
			t.Fatal(err)
		}
		pending = ReadPending(t, ctx, env.DB, d)
		if len(pending) != 1 || pending[0].UUID != "x1" {
			t.Fatalf("with a1 backing off, pending %+v; want x1 alone", pending)
		}
	})

	t.Run("KeepForwardedRows", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		cfg := fast(t, d, rec)
		cfg.KeepForwarded = true
		StartForwarder(t, cfg)
		tx := src.MustBegin(t, ctx)
		pub := newPub(t, tx, d)
		for range 10 {
			if err := pub.Publish("audit", message.NewMessage(watermill.NewUUID(), nil)); err != nil {
				t.Fatal(err)
			}
		}
		commit(t, ctx, tx)
		rec.WaitFor(t, 10, 20*time.Second)
		waitEmpty(t, ctx, env, d)
		time.Sleep(300 * time.Millisecond)
		if n := len(rec.Messages()); n != 10 {
			t.Fatalf("kept rows were published %d times, want 10", n)
		}
		var kept int
		rows, err := env.DB.Query(ctx, `SELECT count(*) FROM `+keptTable(t, d))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			_ = rows.Scan(&kept)
		}
		rows.Close()
		if kept != 10 {
			t.Fatalf("%d rows in the kept rows' table, want 10", kept)
		}
	})

	t.Run("GracefulCloseWhileBusy", func(t *testing.T) {
		d := env.NewDialect(t)
		slow := NewRecorder()
		slow.SetReject(func(string, *message.Message) error { time.Sleep(2 * time.Millisecond); return nil })
		WriteKeyed(t, ctx, src, d, "busy", 20, 100, 20, 4)
		cfg := fast(t, d, slow)
		cfg.Concurrency = 4
		cfg.CloseTimeout = 10 * time.Second
		f, err := forwarder.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Run(ctx) }()
		<-f.Running()
		for slow.Distinct() < 100 {
			time.Sleep(5 * time.Millisecond)
		}
		if err := f.Close(); err != nil {
			t.Fatalf("close while busy: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if slow.Distinct() == 2000 {
			t.Fatal("everything was forwarded before Close; the test did not close a busy forwarder")
		}
		// Nothing is lost: a new forwarder delivers the rest.
		StartForwarder(t, fast(t, d, slow))
		slow.WaitFor(t, 2000, 60*time.Second)
		CheckKeyOrder(t, slow.Messages(), forwarder.DefaultKeyMetadataField)
	})

	t.Run("BadConfig", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		src := env.source(t, d)
		for name, cfg := range map[string]forwarder.Config{
			"no DB":          {Dialect: d, Destination: rec, Source: src},
			"no dialect":     {DB: env.DB, Destination: rec, Source: src},
			"no destination": {DB: env.DB, Dialect: d, Source: src},
			"batch":          {DB: env.DB, Dialect: d, Destination: rec, Source: src, BatchSize: -1},
			"backoff":        {DB: env.DB, Dialect: d, Destination: rec, Source: src, Retry: forwarder.ExponentialRetry{Min: time.Minute, Max: time.Second}},
			"partitions":     {DB: env.DB, Dialect: d, Destination: rec, Source: forwarder.Polling{Partitions: 100000}},
			"tiny lease TTL": {DB: env.DB, Dialect: d, Destination: rec, Source: forwarder.Polling{LeaseTTL: time.Millisecond}},
		} {
			if _, err := forwarder.New(cfg); !errors.Is(err, forwarder.ErrInvalidConfig) {
				t.Fatalf("%s: want ErrInvalidConfig, got %v", name, err)
			}
		}
		if !env.polling() {
			return
		}
		// Instances that disagree on Partitions refuse to start.
		StartForwarder(t, fast(t, d, rec))
		cfg := fast(t, d, rec)
		cfg.Source = forwarder.Polling{PollInterval: 50 * time.Millisecond, Partitions: 4, LeaseTTL: 2 * time.Second}
		f, err := forwarder.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Run(ctx); !errors.Is(err, forwarder.ErrInvalidConfig) {
			t.Fatalf("mismatched partitions: want ErrInvalidConfig, got %v", err)
		}
	})

	// Instances of one outbox that disagree on a setting they must share
	// (a dead letter holding its key, exactly once) refuse to start with
	// an error naming it, as they do for Partitions; the first keeps
	// running.
	t.Run("SettingsMustAgree", func(t *testing.T) {
		if !env.polling() {
			t.Skip("one reader streams from the slot")
		}
		d := env.NewDialect(t)
		rec := NewRecorder()
		first := StartForwarder(t, fast(t, d, rec))
		cfg := fast(t, d, rec)
		cfg.DeadLetterHoldsKey = true
		f, err := forwarder.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = f.Run(ctx)
		var mismatch *sqladapters.SettingMismatchError
		if !errors.Is(err, forwarder.ErrInvalidConfig) || !errors.As(err, &mismatch) || mismatch.Setting != "Config.DeadLetterHoldsKey" ||
			!strings.Contains(err.Error(), "DeadLetterHoldsKey") {
			t.Fatalf("an instance with DeadLetterHoldsKey next to one without: want a SettingMismatchError naming it, got %v", err)
		}
		if err := first.Ready(ctx); err != nil {
			t.Fatalf("the first instance stopped: %v", err)
		}
		// Once the first is gone, the setting may change.
		if err := first.Close(); err != nil {
			t.Fatal(err)
		}
		StartForwarder(t, cfg)
	})

	t.Run("MissingTables", func(t *testing.T) {
		if env.NewUnmigratedDialect == nil {
			t.Skip("no unmigrated dialect")
		}
		d := env.NewUnmigratedDialect(t)
		f, err := forwarder.New(forwarder.Config{DB: env.DB, Dialect: d, Destination: NewRecorder(), Source: env.source(t, d)})
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Run(ctx); !errors.Is(err, sqladapters.ErrMissingTable) {
			t.Fatalf("want ErrMissingTable, got %v", err)
		}
	})

	t.Run("Delayed", func(t *testing.T) { delayed(t, env, fast) })

	t.Run("Faults", func(t *testing.T) { Faults(t, env) })
}

// randomKey returns n bytes of random base64 text: a key no compression
// shortens, so it takes its full length wherever it is stored.
func randomKey(t testing.TB, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)[:n]
}

// waitDeadLetters waits until d has n dead letters and returns them.
func waitDeadLetters(t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect, n int) []sqladapters.DeadLetter {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		dead, err := deadLetters(ctx, env, d, n+1)
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) == n {
			return dead
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d dead letters, want %d", len(dead), n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitOwned waits until the forwarders together hold all whole
// partitions, each of them some when spread is set (Polling shares them;
// with cdc.Source one reader holds the slot's one partition).
func WaitOwned(t testing.TB, fs []*forwarder.Forwarder, whole int, spread bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		total, each := 0, true
		for _, f := range fs {
			n := len(f.Partitions())
			total += n
			each = each && n > 0
		}
		if total == whole && (each || !spread) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the %d instances hold %d of %d partitions (each some: %v)", len(fs), total, whole, each)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// deadLetters lists up to limit dead letters of d.
func deadLetters(ctx context.Context, env Env, d sqladapters.Dialect, limit int) ([]sqladapters.DeadLetter, error) {
	o, err := ops.New(env.DB, d)
	if err != nil {
		return nil, err
	}
	return o.ListDeadLetters(ctx, ops.ListQuery{Limit: limit})
}

// requeue requeues the dead letters ids of d.
func requeue(ctx context.Context, env Env, d sqladapters.Dialect, ids ...int64) (int64, error) {
	o, err := ops.New(env.DB, d)
	if err != nil {
		return 0, err
	}
	return o.Requeue(ctx, ops.Filter{IDs: ids}, ops.ChangeOptions{})
}

// backlog is the pending and dead rows of an outbox.
type backlog struct{ Pending, Dead int64 }

// waitBacklog waits until the outbox's stats report want.
func waitBacklog(t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect, want backlog) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := d.OutboxStats(ctx, env.DB)
		if err != nil {
			t.Fatal(err)
		}
		got := backlog{Pending: st.Pending, Dead: st.Dead}
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog %+v, want %+v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitEmpty waits until the outbox has no pending rows.
func waitEmpty(t testing.TB, ctx context.Context, env Env, d sqladapters.Dialect) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := len(ReadPending(t, ctx, env.DB, d))
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keptTable returns the quoted name of the table of kept rows of d.
func keptTable(t *testing.T, d sqladapters.Dialect) string {
	t.Helper()
	tables, ok := d.(interface{ Tables() []string })
	if !ok {
		t.Fatalf("%T does not list its tables", d)
	}
	for _, table := range tables.Tables() {
		if strings.HasSuffix(strings.Trim(table, "\"`"), "_kept") {
			return table
		}
	}
	t.Fatalf("the %s dialect has no table of kept rows", d.Name())
	return ""
}
