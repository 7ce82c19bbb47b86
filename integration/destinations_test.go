package integration_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// What the tests of each destination share: Watermill's universal Pub/Sub
// tests run through the outbox, and an outage of a broker the test runs
// itself, with the destination's calls counted.

// outboxPublisher is the publishing side of a Pub/Sub whose messages go
// through the outbox: each Publish call commits its messages into the
// outbox in a transaction of its own, as an application's transaction
// would, and a forwarder moves them to the destination.
type outboxPublisher struct {
	db  sqladapters.DB
	cfg forwarder.PublisherConfig
}

func (p outboxPublisher) Publish(topic string, msgs ...*message.Message) error {
	ctx := context.Background()
	tx, err := p.db.Begin(ctx, sqlTxOptions)
	if err != nil {
		return err
	}
	pub, err := forwarder.NewPublisher(tx, p.cfg)
	if err == nil {
		err = pub.Publish(topic, msgs...)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// Close does nothing: the outbox and its forwarder outlive a publisher.
func (outboxPublisher) Close() error { return nil }

// pubSubThroughOutbox runs Watermill's universal Pub/Sub tests with
// messages that take the whole way: outbox → forwarder → dest → a Watermill
// subscriber made by newSub (group is the consumer group, "" for none).
// One forwarder serves the whole run, as one serves an application; every
// constructor call gets a publisher into its outbox and a new subscriber.
//
// The outbox keeps order per ordering key, and the universal tests check
// order per topic: the messages are keyed by their topic
// (PublisherConfig.OrderingKey), as an application that needs a topic's
// total order would key them.
func pubSubThroughOutbox(t *testing.T, db sqladapters.DB, d sqladapters.Dialect, dest message.Publisher, features tests.Features, newSub func(t *testing.T, group string) message.Subscriber) {
	conformance.StartForwarder(t, forwarder.Config{
		DB:                  db,
		Dialect:             d,
		Destination:         dest,
		DelayedPollInterval: 100 * time.Millisecond,
		Source:              forwarder.Polling{PollInterval: 100 * time.Millisecond},
		Retry:               forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: time.Second},
		MaxAttempts:         -1,
	})
	pub := outboxPublisher{db: db, cfg: forwarder.PublisherConfig{
		Dialect:     d,
		OrderingKey: func(topic string, _ *message.Message) string { return topic },
	}}
	tests.TestPubSub(t, features,
		func(t *testing.T) (message.Publisher, message.Subscriber) { return pub, newSub(t, "") },
		func(t *testing.T, group string) (message.Publisher, message.Subscriber) { return pub, newSub(t, group) },
	)
}

// pubSubTopics makes the universal tests' topic names start with prefix,
// so that the run can remove what it created on a shared broker.
func pubSubTopics(prefix string) func(tests.TestContext) string {
	return func(tctx tests.TestContext) string { return prefix + string(tctx.TestID) }
}

// callRecorder counts the Publish calls of the publisher it wraps and
// records when each started and ended.
type callRecorder struct {
	message.Publisher
	mu    sync.Mutex
	calls []callSpan
}

// callSpan is one Publish call.
type callSpan struct {
	start, end time.Time // end is zero while the call runs
	err        error
}

func (p *callRecorder) Publish(topic string, msgs ...*message.Message) error {
	p.mu.Lock()
	i := len(p.calls)
	p.calls = append(p.calls, callSpan{start: time.Now()})
	p.mu.Unlock()
	err := p.Publisher.Publish(topic, msgs...)
	p.mu.Lock()
	p.calls[i].end, p.calls[i].err = time.Now(), err
	p.mu.Unlock()
	return err
}

// spans returns a copy of the calls so far.
func (p *callRecorder) spans() []callSpan {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// failedSince reports whether a call that started after from has failed.
func (p *callRecorder) failedSince(from time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.calls {
		if !c.start.Before(from) && !c.end.IsZero() && c.err != nil {
			return true
		}
	}
	return false
}

// probeStats describes the calls that started in [from, to): how many,
// the most that ran at once, and the errors of those that failed.
func probeStats(calls []callSpan, from, to time.Time) (n, maxOverlap int, errs []string) {
	var in []callSpan
	for _, c := range calls {
		if !c.start.Before(from) && c.start.Before(to) {
			in = append(in, c)
			if c.err != nil {
				errs = append(errs, c.err.Error())
			}
		}
	}
	for _, c := range in {
		overlap := 0
		for _, o := range in {
			// o runs when c starts: started no later and not ended yet.
			if !o.start.After(c.start) && (o.end.IsZero() || o.end.After(c.start)) {
				overlap++
			}
		}
		maxOverlap = max(maxOverlap, overlap)
	}
	return len(in), maxOverlap, errs
}

// serverControl takes a destination down and brings it back: a server the
// test runs as its own process, or a Redis told to refuse writes.
type serverControl interface {
	Stop(t testing.TB)
	Start(t testing.TB)
}

// maxProbeCallsDown bounds the destination calls a forwarder makes while
// the destination is down, once its breaker opened: a probe at a time,
// the delay between probes doubling from 50 ms to 1 s, so about one call
// per second of outage after the first few.
func maxProbeCallsDown(outage time.Duration) int { return int(outage/time.Second) + 10 }

// forwardThroughServerOutage is forwardThroughOutage for a destination the
// test controls (serverControl): a producer commits plan.messages keyed
// messages to topic at plan.rate, the destination goes down once a quarter
// of them is written and comes back after the outage, and then every
// message must be in the destination in commit order per key (read by
// collect, started after the restart, from the first message), with
// nothing in the dead letters. While the destination is down the forwarder
// must pause behind its breaker: once a call failed, the calls that start
// later run one at a time (the probe) and there are few of them, and the
// outbox is read only a few times. pub is the destination publisher; a
// wrapper records its calls.
func forwardThroughServerOutage(t *testing.T, plan outagePlan, pub message.Publisher, topic string, server serverControl, collect func(t *testing.T) *testenv.Collection) {
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	reads := countPendingReads(db, d)
	counted := &callRecorder{Publisher: pub}
	conformance.StartForwarder(t, forwarder.Config{
		DB:          reads,
		Dialect:     d,
		Destination: counted,
		Retry:       forwarder.ExponentialRetry{Min: 100 * time.Millisecond, Max: time.Second},
		// A row may fail twice before it is dead-lettered (and lost to
		// the stream): a forwarder that counted failed probes as attempts
		// would lose the probed rows within a few seconds of outage.
		MaxAttempts: 2,
	})
	ctx := testenv.Ctx(t, plan.wait+2*plan.outage+time.Duration(plan.messages/plan.rate)*time.Second)
	stream := writeStream(ctx, db, d, topic, plan)

	waitUntil(t, ctx, "a quarter of the stream", func() bool { return stream.written.Load() >= int64(plan.messages/4) })
	server.Stop(t)
	stopped := time.Now()
	readsBefore := reads.n.Load()
	// The breaker opens with the first failed call; calls that were in
	// flight at the stop may end later, but no new one but the probe may
	// start after it.
	waitUntil(t, ctx, "a failed call after the stop", func() bool { return counted.failedSince(stopped) })
	failedAt := time.Now()
	sleepCtx(ctx, plan.outage-time.Since(stopped))
	downFor := time.Since(stopped)
	readsDown := reads.n.Load() - readsBefore
	restartAt := time.Now()
	server.Start(t)
	restarted := time.Now()

	<-stream.done
	if stream.err != nil {
		t.Fatalf("producer: %v", stream.err)
	}
	col := collect(t)
	if err := col.WaitN(ctx, plan.messages, plan.wait); err != nil {
		dead, _ := listDeadLetters(context.Background(), db, d)
		t.Fatalf("after the restart: %v; dead letters: %s", err, deadSummary(dead))
	}
	if err := col.CheckOrder(stream.expected); err != nil {
		t.Fatal(err)
	}
	calls, overlap, errs := probeStats(counted.spans(), failedAt, restartAt)
	t.Logf("%d messages, %d keys, %d/s, destination down %v: all in the destination in order %v after the restart, %d duplicates; "+
		"while down: %d calls started after the first failure (at most %d at once), %d pending reads; first failure: %s",
		plan.messages, plan.keys, plan.rate, downFor.Round(100*time.Millisecond), time.Since(restarted).Round(100*time.Millisecond),
		col.Duplicates(), calls, overlap, readsDown, firstOf(errs))
	if overlap > 1 {
		t.Fatalf("%d calls ran at once while the destination was down; the forwarder should probe with one call at a time", overlap)
	}
	if calls > maxProbeCallsDown(plan.outage) {
		t.Fatalf("%d calls while the destination was down for %v; a probe at a time makes at most %d", calls, downFor.Round(100*time.Millisecond), maxProbeCallsDown(plan.outage))
	}
	if readsDown > maxPendingReadsDown {
		t.Fatalf("the forwarder read the outbox %d times while the destination was down; it should pause behind a probe (at most %d reads)", readsDown, maxPendingReadsDown)
	}
	if dead, err := listDeadLetters(context.Background(), db, d); err != nil || len(dead) > 0 {
		t.Fatalf("dead letters after the outage (%v): %s", err, deadSummary(dead))
	}
}

func firstOf(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return s[0]
}
