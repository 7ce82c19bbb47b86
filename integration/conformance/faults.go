package conformance

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/internal/testlog"
	"github.com/millbox/millbox/sqladapters"
)

// Faults runs the forwarder's fault suite: a hanging Publish holds back
// only its own key, a call past PublishTimeout never lets its key move on,
// a destination outage pauses reads behind one probe, Run's failures
// release whoever waits for it, and a closing instance hands its
// partitions over at once.
func Faults(t *testing.T, env Env) {
	ctx := context.Background()
	src := env.Sources[0]
	base := func(t testing.TB, d sqladapters.Dialect, dest message.Publisher) forwarder.Config {
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
	keyOf := func(m *message.Message) string { return m.Metadata.Get(forwarder.DefaultKeyMetadataField) }

	// One key's only call hangs while no other call is out and other keys
	// keep arriving: their messages must arrive while it hangs, with no
	// PublishTimeout to free anything meanwhile.
	t.Run("HangingPublishHoldsOnlyItsKey", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		rec.SetReject(func(_ string, m *message.Message) error {
			if keyOf(m) == "slow" {
				once.Do(func() { close(entered) })
				<-release
			}
			return nil
		})
		cfg := base(t, d, rec)
		cfg.PublishTimeout = time.Hour
		StartForwarder(t, cfg)
		var releaseOnce sync.Once
		unblock := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unblock) // before the forwarder's Close, also when the test fails
		writeKey(t, ctx, src, d, "slow", 0, 5)
		<-entered
		// Written after the slow call started: they must not wait for it.
		const keys, perKey = 50, 20
		WriteKeyed(t, ctx, src, d, "t", keys, perKey, 5, 2)
		rec.WaitFor(t, keys*perKey, 60*time.Second)
		select {
		case <-release:
			t.Fatal("released early")
		default: // the slow call is still blocked: the other keys did not wait for it
		}
		unblock()
		rec.WaitFor(t, keys*perKey+5, 30*time.Second)
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	// A destination that gives up at its context's deadline
	// (PublishTimeout), saying the broker did not answer, reports an
	// outage: the forwarder pauses behind a probe and counts no attempt,
	// rather than counting a timeout for every key it raced.
	t.Run("DeadlineHonouringDestinationCountsNoAttempt", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		var down atomic.Bool
		down.Store(true)
		var calls atomic.Int32
		rec.SetReject(func(_ string, m *message.Message) error {
			if !down.Load() {
				return nil
			}
			calls.Add(1)
			<-m.Context().Done()
			return forwarder.DestinationUnavailable(fmt.Errorf("no answer: %w", m.Context().Err()))
		})
		var failures atomic.Int32
		cfg := base(t, d, rec)
		cfg.PublishTimeout = 100 * time.Millisecond
		cfg.Hooks.OnFailure = func(forwarder.FailedAttempt) { failures.Add(1) }
		StartForwarder(t, cfg)
		WriteKeyed(t, ctx, src, d, "t", 5, 4, 2, 1)
		deadline := time.Now().Add(60 * time.Second)
		for calls.Load() < 10 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := calls.Load(); n < 10 {
			t.Fatalf("%d calls in a minute; want probes to go on", n)
		}
		down.Store(false)
		rec.WaitFor(t, 20, 60*time.Second)
		if n := failures.Load(); n > 0 {
			t.Fatalf("%d failed attempts recorded for calls that returned at their deadline with the destination unavailable; want none", n)
		}
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	// A probe of a destination that is down may hang past
	// PublishTimeout: that probe failed, and the next probe goes out (to
	// another key: the hung call's key waits for it to return). Before,
	// the breaker waited for the hung probe's answer forever.
	t.Run("ProbePastPublishTimeoutProbesAgain", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		release := make(chan struct{})
		var releaseOnce sync.Once
		t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
		var down atomic.Bool
		down.Store(true)
		var calls atomic.Int32
		rec.SetReject(func(_ string, m *message.Message) error {
			if !down.Load() {
				return nil
			}
			if calls.Add(1) <= 5 {
				// The outage shows: the breaker opens.
				return forwarder.DestinationUnavailable(errors.New("connection refused"))
			}
			<-release // the probes hang, past PublishTimeout
			return forwarder.DestinationUnavailable(errors.New("connection refused"))
		})
		cfg := base(t, d, rec)
		cfg.PublishTimeout = 100 * time.Millisecond
		StartForwarder(t, cfg)
		WriteKeyed(t, ctx, src, d, "t", 5, 4, 2, 1)
		deadline := time.Now().Add(60 * time.Second)
		for calls.Load() < 8 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := calls.Load(); n < 8 {
			t.Fatalf("%d calls in a minute: the forwarder stopped probing after a probe hung past PublishTimeout", n)
		}
		down.Store(false)
		releaseOnce.Do(func() { close(release) })
		rec.WaitFor(t, 20, 60*time.Second)
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	// While one key's call hangs, the other keys keep their pace: a
	// message committed after the previous one arrived arrives about as
	// soon as a message through an independent forwarder with no hung
	// call (the pacer) does. The pacer's messages go one at a time, each
	// written once the one before arrived; a message of another key must
	// arrive before pacerLimit of them did. (A destination that answers
	// every call but the hung one must not count as stalled: reads were
	// refused for up to a second after each read that found nothing new,
	// some 30 or more pacer messages; the limit leaves room for a loaded
	// machine, where SQLite's single writer made 5 too few.)
	t.Run("HungCallLeavesOtherKeysTheirPace", func(t *testing.T) {
		const rounds, pacerLimit = 5, 10
		d := env.NewDialect(t)
		rec := NewRecorder()
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		rec.SetReject(func(_ string, m *message.Message) error {
			if keyOf(m) == "slow" {
				once.Do(func() { close(entered) })
				<-release
			}
			return nil
		})
		cfg := base(t, d, rec)
		cfg.PublishTimeout = time.Hour
		StartForwarder(t, cfg)
		var releaseOnce sync.Once
		unblock := func() { releaseOnce.Do(func() { close(release) }) }
		t.Cleanup(unblock) // before the forwarder's Close, also when the test fails

		pd, pacerRec := env.NewDialect(t), NewRecorder()
		pcfg := base(t, pd, pacerRec)
		pcfg.Source = forwarder.Polling{Partitions: 1}
		StartForwarder(t, pcfg)
		paced := 0
		pace := func() {
			t.Helper()
			writeKey(t, ctx, src, pd, "pace", paced, 1)
			paced++
			for !pacerRec.has("pace", paced-1) {
				time.Sleep(time.Millisecond)
			}
		}

		writeKey(t, ctx, src, d, "slow", 0, 1)
		<-entered
		// A call that starts after the hung one and ends shows that the
		// destination answers.
		writeKey(t, ctx, src, d, "warm", 0, 1)
		for !rec.has("warm", 0) {
			time.Sleep(time.Millisecond)
		}
		for r := range rounds {
			// Let the forwarder find nothing new for a while, as
			// between the commits of a slow stream.
			for range 3 {
				pace()
			}
			key := "k" + strconv.Itoa(r)
			writeKey(t, ctx, src, d, key, 0, 1)
			n := 0
			for !rec.has(key, 0) {
				if n == pacerLimit {
					t.Fatalf("round %d: %d messages through an independent forwarder arrived one after the other before the message of key %s, committed before them, while key slow's call hangs", r, n, key)
				}
				pace()
				n++
			}
			t.Logf("round %d: %d pacer messages arrived before the message of key %s", r, n, key)
		}
		select {
		case <-release:
			t.Fatal("released early")
		default:
		}
	})

	t.Run("TimedOutCallNeverLetsItsKeyMoveOn", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		rec.SetReject(func(_ string, m *message.Message) error {
			if keyOf(m) == "slow" && m.Metadata.Get("seq") == "0" {
				first := false
				once.Do(func() { first = true; close(entered) })
				if first {
					<-release
				}
			}
			return nil
		})
		var timeouts atomic.Int32
		cfg := base(t, d, rec)
		cfg.PublishTimeout = 100 * time.Millisecond
		cfg.Hooks.OnFailure = func(forwarder.FailedAttempt) { timeouts.Add(1) }
		StartForwarder(t, cfg)
		writeKey(t, ctx, src, d, "slow", 0, 10)
		<-entered
		WriteKeyed(t, ctx, src, d, "t", 10, 10, 5, 2)
		rec.WaitFor(t, 100, 60*time.Second)
		for timeouts.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		// The call timed out and its backoff passed many times over, yet
		// no later message of its key went out while it hangs.
		time.Sleep(500 * time.Millisecond)
		for _, m := range rec.Messages() {
			if m.Metadata.Get(forwarder.DefaultKeyMetadataField) == "slow" {
				t.Fatalf("message seq %s of key slow went out while its first call hangs", m.Metadata.Get("seq"))
			}
		}
		close(release)
		rec.WaitFor(t, 110, 30*time.Second)
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	t.Run("OutagePausesReadsBehindOneProbe", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		var down atomic.Bool
		var refused atomic.Int32
		down.Store(true)
		rec.SetReject(func(string, *message.Message) error {
			if down.Load() {
				refused.Add(1)
				return fmt.Errorf("broker gone: %w", forwarder.ErrDestinationUnavailable)
			}
			return nil
		})
		var reads atomic.Int32
		var failures atomic.Int32
		cfg := base(t, d, rec)
		cfg.Hooks.OnRead = func(int) { reads.Add(1) }
		cfg.Hooks.OnFailure = func(forwarder.FailedAttempt) { failures.Add(1) }
		StartForwarder(t, cfg)
		writeKey(t, ctx, src, d, "first", 0, 1)
		for refused.Load() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		// The destination is down. Keep writing: each commit wakes the
		// forwarder, which must not read while it cannot publish.
		before := reads.Load()
		for i := range 40 {
			writeKey(t, ctx, src, d, "k"+strconv.Itoa(i%8), i/8, 1)
		}
		for refused.Load() < 5 { // several probes went out and failed
			time.Sleep(10 * time.Millisecond)
		}
		during := reads.Load() - before
		down.Store(false)
		rec.WaitFor(t, 41, 30*time.Second)
		if during > 1 {
			t.Fatalf("%d reads of the outbox while the destination was down after 40 commits; want at most the one in flight", during)
		}
		if n := failures.Load(); n != 0 {
			t.Fatalf("%d failed attempts recorded for an outage of the destination; it is not the messages' fault", n)
		}
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	// The next two check per-key order where the forwarder reads past its
	// floor (on databases that report a horizon): between head reads, one
	// per PollInterval, reads start after the floor, so a floor above a
	// row that can still become due would hold that row back until the
	// next head read and let its key's later rows overtake it. Each keeps
	// a row out of sight across several head reads.
	headEvery := func(t testing.TB, d sqladapters.Dialect, dest message.Publisher) forwarder.Config {
		cfg := base(t, d, dest)
		SetPollInterval(&cfg, time.Second)
		return cfg
	}

	t.Run("LongTransactionKeepsItsKeyOrder", func(t *testing.T) {
		d := env.NewDialect(t)
		if !d.Features().ConcurrentWriters {
			t.Skip("the database runs one writer at a time: a transaction left open would block the others")
		}
		rec := NewRecorder()
		var reads atomic.Int32
		cfg := headEvery(t, d, rec)
		cfg.Hooks.OnRead = func(int) { reads.Add(1) }
		StartForwarder(t, cfg)
		for k := range 10 {
			writeKey(t, ctx, src, d, fmt.Sprint("before-", k), 0, 10)
		}
		rec.WaitFor(t, 100, 60*time.Second)
		// A transaction draws its row's id and stays open while many
		// rows after it are written and forwarded and the forwarder
		// reads on...
		tx := src.MustBegin(t, ctx)
		defer sqladapters.Rollback(tx)
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		first := message.NewMessage(watermill.NewUUID(), []byte("late-0"))
		first.Metadata.Set(forwarder.DefaultKeyMetadataField, "late")
		first.Metadata.Set("seq", "0")
		if err := pub.Publish("t", first); err != nil {
			t.Fatal(err)
		}
		WriteKeyed(t, ctx, src, d, "t", 20, 50, 5, 2)
		rec.WaitFor(t, 1100, 60*time.Second)
		for i := 0; (env.polling() && reads.Load() < 20) || i < 125; i++ { // 2.5 s at least, and 20 reads with Polling
			writeKey(t, ctx, src, d, "other", i, 1)
			time.Sleep(20 * time.Millisecond)
		}
		// ...then commits, and the key's next message is written after
		// it: it must not go out first.
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		writeKey(t, ctx, src, d, "late", 1, 1)
		deadline := time.Now().Add(30 * time.Second)
		for !rec.has("late", 0) || !rec.has("late", 1) {
			if time.Now().After(deadline) {
				t.Fatal("the messages of key late did not arrive")
			}
			time.Sleep(10 * time.Millisecond)
		}
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	t.Run("RetriedRowKeepsItsKeyOrder", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		var failures atomic.Int32
		rec.SetReject(func(_ string, m *message.Message) error {
			if keyOf(m) == "flaky" && m.Metadata.Get("seq") == "0" && failures.Add(1) <= 2 {
				return errors.New("rejected twice")
			}
			return nil
		})
		cfg := headEvery(t, d, rec)
		cfg.Retry = forwarder.ExponentialRetry{Min: 2500 * time.Millisecond, Max: 2500 * time.Millisecond, Jitter: -1} // across two head reads
		StartForwarder(t, cfg)
		for k := range 10 {
			writeKey(t, ctx, src, d, fmt.Sprint("before-", k), 0, 10)
		}
		rec.WaitFor(t, 100, 60*time.Second)
		// The key's rows keep coming, one every 20 ms, so that reads run
		// all along and rows of the key lie above any floor, also between
		// the end of the backoff and the next head read.
		stop := make(chan struct{})
		var written atomic.Int32
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				writeKey(t, ctx, src, d, "flaky", i, 1)
				written.Add(1)
			}
		})
		WriteKeyed(t, ctx, src, d, "u", 10, 10, 5, 2)
		deadline := time.Now().Add(60 * time.Second)
		for !rec.has("flaky", 0) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
		close(stop)
		wg.Wait()
		rec.WaitFor(t, 200+int(written.Load()), 60*time.Second)
		if failures.Load() < 3 {
			t.Fatalf("the first message of key flaky was tried %d times, want 3", failures.Load())
		}
		CheckKeyOrder(t, rec.Messages(), forwarder.DefaultKeyMetadataField)
	})

	t.Run("RunFailureReleasesWaiters", func(t *testing.T) {
		cases := map[string]func() (forwarder.Config, error){}
		if env.polling() {
			cases["partitions mismatch"] = func() (forwarder.Config, error) {
				d := env.NewDialect(t)
				StartForwarder(t, base(t, d, NewRecorder()))
				cfg := base(t, d, NewRecorder())
				cfg.Source = forwarder.Polling{PollInterval: 50 * time.Millisecond, Partitions: 4, LeaseTTL: 2 * time.Second}
				return cfg, forwarder.ErrInvalidConfig
			}
		}
		if env.NewUnmigratedDialect != nil {
			cases["missing tables"] = func() (forwarder.Config, error) {
				return base(t, env.NewUnmigratedDialect(t), NewRecorder()), sqladapters.ErrMissingTable
			}
		}
		for name, setup := range cases {
			cfg, want := setup()
			f, err := forwarder.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { errc <- f.Run(ctx) }()
			<-f.Running() // closes although Run failed
			if err := f.Ready(ctx); !errors.Is(err, want) {
				t.Fatalf("%s: Ready = %v, want %v", name, err, want)
			}
			if err := <-errc; !errors.Is(err, want) {
				t.Fatalf("%s: Run = %v, want %v", name, err, want)
			}
		}
	})

	t.Run("CloseHandsOverAtOnce", func(t *testing.T) {
		d := env.NewDialect(t)
		rec := NewRecorder()
		cfg := base(t, d, rec)
		whole := 1 // the replication slot
		if env.polling() {
			// Renewals every 20 minutes: only the handover can move the
			// partitions within this test.
			cfg.Source = forwarder.Polling{PollInterval: 50 * time.Millisecond, Partitions: 8, LeaseTTL: time.Hour}
			whole = 8
		}
		a := StartForwarder(t, cfg)
		if !env.polling() {
			WaitOwned(t, []*forwarder.Forwarder{a}, whole, false)
		}
		b := StartForwarder(t, cfg)
		leaving, survivor := b, a
		if env.polling() {
			WaitOwned(t, []*forwarder.Forwarder{a, b}, whole, true)
		} else {
			// One reader streams, the other stands by: the reader leaves.
			leaving, survivor = a, b
		}
		if err := leaving.Close(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for len(survivor.Partitions()) != whole {
			if time.Now().After(deadline) {
				t.Fatalf("the survivor holds %v, not all %d partitions, after the other instance closed", survivor.Partitions(), whole)
			}
			time.Sleep(10 * time.Millisecond)
		}
		writeKey(t, ctx, src, d, "after", 0, 3)
		rec.WaitFor(t, 3, 30*time.Second)
	})
}

// writeKey commits n messages of key with seq from, from+1, ... in one
// transaction.
func writeKey(t testing.TB, ctx context.Context, src TxSource, d sqladapters.Dialect, key string, from, n int) {
	t.Helper()
	msgs := make([]*message.Message, n)
	for i := range msgs {
		m := message.NewMessage(watermill.NewUUID(), []byte(key))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
		m.Metadata.Set("seq", strconv.Itoa(from+i))
		msgs[i] = m
	}
	if err := publishCommitted(ctx, src, forwarder.PublisherConfig{Dialect: d}, "t", msgs); err != nil {
		t.Fatal(err)
	}
}
