package integration_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/nats-io/nats.go"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// NATS JetStream as a destination: watermill-nats's publisher with
// JetStream on (each message waits for the stream's acknowledgement) and
// its subscriber.

// TestForwarderNATSPubSub runs Watermill's universal Pub/Sub tests through
// outbox → forwarder → NATS JetStream → watermill-nats subscriber, on
// PostgreSQL and MariaDB, with the features watermill-nats claims for
// itself except exactly-once delivery (the outbox delivers at least once).
func TestForwarderNATSPubSub(t *testing.T) {
	url := testenv.RequireNATS(t)
	for _, name := range []string{"postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			c := crashDatabase(t, name)
			prefix := testenv.UniqueName("millbox_pubsub_") + "_"
			t.Cleanup(func() {
				if err := testenv.DeleteNATSStreamsWithPrefix(url, prefix); err != nil {
					t.Logf("delete streams: %v", err)
				}
			})
			features := tests.Features{
				ConsumerGroups:                      true,
				GuaranteedOrder:                     true,
				GuaranteedOrderWithSingleSubscriber: true,
				Persistent:                          true,
				NewSubscriberReceivesOldMessages:    true,
				GenerateTopicFunc:                   pubSubTopics(prefix),
			}
			pubSubThroughOutbox(t, c.db, c.dialect, testenv.NATSPublisher(t, url), features, func(t *testing.T, group string) message.Subscriber {
				// As watermill-nats's own tests: two subscriptions per
				// consumer group, a durable consumer per group.
				cfg := testenv.NATSSubscriberConfig(url, group)
				if group != "" {
					cfg.SubscribersCount = 2
				}
				cfg.JetStream.AckAsync = true
				sub, err := wmnats.NewSubscriber(cfg, watermill.NopLogger{})
				if err != nil {
					t.Fatal(err)
				}
				// The suite does not close every subscriber it makes.
				t.Cleanup(func() { _ = sub.Close() })
				return sub
			})
		})
	}
}

// keyGroupTopic maps a message to the subject (NATS), stream (Redis) or
// queue (RabbitMQ) of its key's group: topic, sep, and the ordering key's
// group. Each group keeps its keys' order and a consumer per group reads
// them in parallel with the other groups.
func keyGroupTopic(sep string, groups int) func(topic string, m *message.Message) (string, error) {
	return func(topic string, m *message.Message) (string, error) {
		return keyGroup(topic, sep, groups, destination.Key(m)), nil
	}
}

// keyGroup names the subject, stream or queue of key's group.
func keyGroup(topic, sep string, groups int, key string) string {
	return fmt.Sprintf("%s%s%d", topic, sep, uint32(forwarder.KeyHash(key))%uint32(groups))
}

// TestForwarderNATSKeyOrder: 50 keys × 100 messages committed from four
// writers arrive at watermill-nats subscribers, every one once and in
// order per key: with the whole topic on one subject, and with the keys
// spread over four subjects of the stream (one per key group, Config.Topic)
// read by four subscribers.
func TestForwarderNATSKeyOrder(t *testing.T) {
	url := testenv.RequireNATS(t)
	for _, groups := range []int{1, 4} {
		t.Run(fmt.Sprintf("groups=%d", groups), func(t *testing.T) {
			pool := testenv.Postgres(t)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
			stream := testenv.NATSStream(t)
			cfg := forwarder.Config{DB: db, Dialect: d, Destination: testenv.NATSPublisher(t, url)}
			var cols []*testenv.WatermillCollector
			if groups == 1 {
				cols = append(cols, testenv.CollectNATS(t, url, stream))
			} else {
				cfg.Topic = keyGroupTopic(".", groups)
				for g := range groups {
					cols = append(cols, testenv.CollectNATS(t, url, fmt.Sprintf("%s.%d", stream, g)))
				}
			}
			conformance.StartForwarder(t, cfg)
			const keys, perKey = 50, 100
			conformance.WriteKeyed(t, context.Background(), pgxSource(db), d, stream, keys, perKey, 10, 4)
			checkKeyGroups(t, cols, keys*perKey)
		})
	}
}

// checkKeyGroups waits until the collectors received n messages between
// them, and checks that each key's messages arrived at one collector only,
// in order, once each.
func checkKeyGroups(t *testing.T, cols []*testenv.WatermillCollector, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		total := 0
		for _, c := range cols {
			total += c.Distinct()
		}
		if total >= n {
			break
		}
	}
	owner := map[string]int{}
	total, dups := 0, 0
	for i, c := range cols {
		if err := c.CheckSeqOrder("seq"); err != nil {
			t.Fatalf("consumer %d: %v", i, err)
		}
		for _, r := range c.FirstDeliveries() {
			if o, ok := owner[r.Key]; ok && o != i {
				t.Fatalf("key %s arrived at consumers %d and %d", r.Key, o, i)
			}
			owner[r.Key] = i
		}
		total += c.Distinct()
		dups += c.Duplicates()
	}
	if total != n {
		t.Fatalf("%d of %d messages arrived", total, n)
	}
	if dups != 0 {
		t.Fatalf("%d duplicates in a clean run", dups)
	}
	if len(cols) > 1 {
		used := map[int]bool{}
		for _, o := range owner {
			used[o] = true
		}
		if len(used) < 2 {
			t.Fatalf("all keys landed on one of %d groups", len(cols))
		}
	}
}

// TestForwarderNATSRefusedMessages: a message over the server's
// max_payload and a message for a subject no stream takes fail every
// attempt; they end in the dead letters with the reason while the other
// messages, of their keys too, are delivered in order.
func TestForwarderNATSRefusedMessages(t *testing.T) {
	url := testenv.RequireNATS(t)
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
	stream := testenv.NATSStream(t)
	col := testenv.CollectNATSStream(t, url, stream)
	conformance.StartForwarder(t, forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: testenv.NATSPublisher(t, url),
		Retry:       forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		MaxAttempts: 3,
	})
	ctx := context.Background()
	big := message.NewMessage(watermill.NewUUID(), make([]byte, 2<<20)) // over the default max_payload, 1 MiB
	big.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-1")
	big.Metadata.Set("seq", "-1")
	lost := message.NewMessage(watermill.NewUUID(), []byte("x"))
	lost.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-2")
	if err := commitMessages(ctx, db, d, stream, []*message.Message{big}); err != nil {
		t.Fatal(err)
	}
	if err := commitMessages(ctx, db, d, stream+"_without_stream", []*message.Message{lost}); err != nil {
		t.Fatal(err)
	}
	conformance.WriteKeyed(t, ctx, pgxSource(db), d, stream, 5, 20, 5, 1)
	if err := col.WaitN(testenv.Ctx(t, time.Minute), 100, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	dead := waitDead(t, db, d, 2)
	reasons := map[string]string{}
	for _, dl := range dead {
		reasons[dl.UUID] = dl.LastError
	}
	if r := reasons[big.UUID]; !strings.Contains(r, "maximum payload exceeded") {
		t.Fatalf("the oversized message's dead letter says %q", r)
	}
	if r := reasons[lost.UUID]; !strings.Contains(r, "no response from stream") {
		t.Fatalf("the dead letter of the message without a stream says %q", r)
	}
}

// waitDead waits until the outbox holds n dead letters and returns them.
func waitDead(t *testing.T, db sqladapters.DB, d sqladapters.Dialect, n int) []sqladapters.DeadLetter {
	t.Helper()
	var dead []sqladapters.DeadLetter
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if dead, err = listDeadLetters(context.Background(), db, d); err != nil {
			t.Fatal(err)
		}
		if len(dead) >= n {
			break
		}
	}
	if len(dead) != n {
		t.Fatalf("%d dead letters, want %d: %s", len(dead), n, deadSummary(dead))
	}
	return dead
}

// TestOutageForwarderNATS stops a nats-server of the test's own in the
// middle of a keyed stream and starts it again: nothing is lost, order per
// key holds, and while the server is down the forwarder probes with one
// call at a time. Publishes wait 1 s for the stream's acknowledgement, so
// that calls fail within the outage. With few keys, the forwarder must
// know the failures for an outage: it cannot infer one from many keys
// failing in a row.
func TestOutageForwarderNATS(t *testing.T) {
	for _, keys := range []int{50, 3} {
		t.Run(fmt.Sprintf("keys=%d", keys), func(t *testing.T) {
			s := testenv.StartNATSServer(t)
			const stream = "outage"
			if err := testenv.CreateNATSStream(s.URL(), stream); err != nil {
				t.Fatal(err)
			}
			cfg := testenv.NATSPublisherConfig(s.URL())
			cfg.JetStream.ConnectOptions = []nats.JSOpt{nats.MaxWait(time.Second)}
			pub, err := wmnats.NewPublisher(cfg, watermill.NopLogger{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = pub.Close() })
			plan := planOutage()
			plan.keys = keys
			plan.outage = max(plan.outage, 5*time.Second)
			forwardThroughServerOutage(t, plan, pub, stream, s, func(t *testing.T) *testenv.Collection {
				return testenv.CollectNATSStream(t, s.URL(), stream).Collection
			})
		})
	}
}
