package integration_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/redisbatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Redis Streams as a destination: watermill-redisstream's publisher (one
// XADD round trip per message) and millbox's redisbatch publisher (a
// call's messages in one MULTI/EXEC), read by watermill-redisstream's
// subscriber.

// redisPublishers are the destination publishers the Redis tests run
// with, each on a client of its own for addr, closed after the test.
var redisPublishers = []struct {
	name string
	new  func(t *testing.T, addr string) message.Publisher
}{
	{"watermill-redisstream", func(t *testing.T, addr string) message.Publisher { return testenv.RedisPublisher(t, addr) }},
	{"redisbatch", redisBatchPublisher},
}

// redisBatchPublisher is a redisbatch publisher to addr, closed with its
// client after the test.
func redisBatchPublisher(t *testing.T, addr string) message.Publisher {
	client := testenv.NewRedisClient(addr)
	p, err := redisbatch.NewPublisher(redisbatch.Config{Client: client})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		_ = client.Close()
	})
	return p
}

// TestForwarderRedisPubSub runs Watermill's universal Pub/Sub tests through
// outbox → forwarder → Redis Streams → watermill-redisstream subscriber,
// with both publishers, on PostgreSQL and MariaDB, with the features
// watermill-redisstream claims for itself. The suite runs in its short
// sizes: watermill-redisstream's subscriber reads one entry per round trip,
// and with each of the suite's concurrent subscribers in a consumer group
// of its own (as in watermill-redisstream's own tests, so that every one
// gets every message), the full sizes (50 subscribers reading 5,000
// messages each while another test reads 20 × 1,000) overrun the suite's
// 15-second reads on a busy two-core machine.
func TestForwarderRedisPubSub(t *testing.T) {
	addr := testenv.RequireRedis(t)
	for _, pub := range redisPublishers {
		for _, name := range []string{"postgres", "mysql"} {
			t.Run(pub.name+"/"+name, func(t *testing.T) {
				c := crashDatabase(t, name)
				prefix := testenv.UniqueName("millbox_pubsub_") + "_"
				t.Cleanup(func() {
					if err := testenv.DeleteRedisKeysWithPrefix(addr, prefix); err != nil {
						t.Logf("delete streams: %v", err)
					}
				})
				features := tests.Features{
					ConsumerGroups:                      true,
					GuaranteedOrderWithSingleSubscriber: true,
					Persistent:                          true,
					NewSubscriberReceivesOldMessages:    true,
					GenerateTopicFunc:                   pubSubTopics(prefix),
					ForceShort:                          true,
				}
				pubSubThroughOutbox(t, c.db, c.dialect, pub.new(t, addr), features, func(t *testing.T, group string) message.Subscriber {
					// As watermill-redisstream's own tests: without a
					// consumer group, one of its own for the subscriber.
					if group == "" {
						group = watermill.NewShortUUID()
					}
					cfg := testenv.RedisSubscriberConfig(testenv.NewRedisClient(addr), group)
					cfg.ClaimInterval = 3 * time.Second
					cfg.MaxIdleTime = 5 * time.Second
					sub, err := redisstream.NewSubscriber(cfg, watermill.NopLogger{})
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
}

// TestForwarderRedisKeyOrder: 50 keys × 100 messages committed from four
// writers arrive at watermill-redisstream subscribers, every one once and
// in order per key: with the whole topic in one stream, and with the keys
// spread over four streams (one per key group, Config.Topic) read by four
// subscribers.
func TestForwarderRedisKeyOrder(t *testing.T) {
	addr := testenv.RequireRedis(t)
	for _, pub := range redisPublishers {
		for _, groups := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/groups=%d", pub.name, groups), func(t *testing.T) {
				pool := testenv.Postgres(t)
				db := pgxv5.WrapPool(pool)
				d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
				stream := testenv.RedisStream(t)
				cfg := forwarder.Config{DB: db, Dialect: d, Destination: pub.new(t, addr)}
				var cols []*testenv.WatermillCollector
				if groups == 1 {
					cols = append(cols, testenv.CollectRedis(t, addr, stream))
				} else {
					cfg.Topic = keyGroupTopic(":", groups)
					t.Cleanup(func() { _ = testenv.DeleteRedisKeysWithPrefix(addr, stream+":") })
					for g := range groups {
						cols = append(cols, testenv.CollectRedis(t, addr, fmt.Sprintf("%s:%d", stream, g)))
					}
				}
				conformance.StartForwarder(t, cfg)
				const keys, perKey = 50, 100
				conformance.WriteKeyed(t, context.Background(), pgxSource(db), d, stream, keys, perKey, 10, 4)
				checkKeyGroups(t, cols, keys*perKey)
			})
		}
	}
}

// TestForwarderRedisRefusedMessages: a message the marshaller refuses (it
// carries the metadata field watermill-redisstream reserves for the UUID)
// and a message for a key that holds a string, not a stream, fail every
// attempt; they end in the dead letters with the reason, while the other
// messages, of their keys too, are delivered in order.
func TestForwarderRedisRefusedMessages(t *testing.T) {
	addr := testenv.RequireRedis(t)
	for _, pub := range redisPublishers {
		t.Run(pub.name, func(t *testing.T) {
			pool := testenv.Postgres(t)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
			stream := testenv.RedisStream(t)
			notStream := testenv.RedisStream(t)
			client := testenv.NewRedisClient(addr)
			defer client.Close()
			if err := client.Set(context.Background(), notStream, "a string", 0).Err(); err != nil {
				t.Fatal(err)
			}
			col := testenv.CollectRedisStream(t, addr, stream)
			conformance.StartForwarder(t, forwarder.Config{
				DB:          db,
				Dialect:     d,
				Destination: pub.new(t, addr),
				Retry:       forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
				MaxAttempts: 3,
			})
			ctx := context.Background()
			reserved := message.NewMessage(watermill.NewUUID(), []byte("x"))
			reserved.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-1")
			reserved.Metadata.Set("seq", "-1")
			reserved.Metadata.Set(redisstream.UUIDHeaderKey, "mine")
			wrongType := message.NewMessage(watermill.NewUUID(), []byte("x"))
			wrongType.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-2")
			if err := commitMessages(ctx, db, d, stream, []*message.Message{reserved}); err != nil {
				t.Fatal(err)
			}
			if err := commitMessages(ctx, db, d, notStream, []*message.Message{wrongType}); err != nil {
				t.Fatal(err)
			}
			conformance.WriteKeyed(t, ctx, pgxSource(db), d, stream, 5, 20, 5, 1)
			if err := col.WaitN(testenv.Ctx(t, time.Minute), 100, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := col.CheckSeqOrder("seq"); err != nil {
				t.Fatal(err)
			}
			reasons := map[string]string{}
			for _, dl := range waitDead(t, db, d, 2) {
				reasons[dl.UUID] = dl.LastError
			}
			if r := reasons[reserved.UUID]; !strings.Contains(r, "is reserved by watermill") {
				t.Fatalf("the dead letter of the message the marshaller refused says %q", r)
			}
			if r := reasons[wrongType.UUID]; !strings.Contains(r, "WRONGTYPE") {
				t.Fatalf("the dead letter of the message for a string key says %q", r)
			}
		})
	}
}

// TestRedisBatchStopsAtFailedMessage: a message the marshaller refuses in
// the middle of a call ends the call there. The messages before it are
// added and reported as the PartialError's prefix, the ones after it are
// not added, and the failure is the message's, not the server's.
func TestRedisBatchStopsAtFailedMessage(t *testing.T) {
	addr := testenv.RequireRedis(t)
	stream := testenv.RedisStream(t)
	pub := redisBatchPublisher(t, addr)
	msgs := seqMessages("key-1", 0, 4)
	msgs[2].Metadata.Set(redisstream.UUIDHeaderKey, "mine")
	err := pub.Publish(stream, msgs...)
	var pe *forwarder.PartialError
	if !errors.As(err, &pe) || pe.Delivered != 2 {
		t.Fatalf("want a PartialError with 2 delivered, got %v", err)
	}
	if errors.Is(err, forwarder.ErrDestinationUnavailable) || !strings.Contains(err.Error(), "reserved") {
		t.Fatalf("the failure must be the message's and say so: %v", err)
	}
	client := testenv.NewRedisClient(addr)
	defer client.Close()
	entries, err := client.XRange(context.Background(), stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, fmt.Sprint(e.Values[redisstream.UUIDHeaderKey]))
	}
	if want := []string{msgs[0].UUID, msgs[1].UUID}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("stream holds %v, want the first two messages %v", got, want)
	}
}

// TestOutageForwarderRedis stops a redis-server of the test's own in the
// middle of a keyed stream and starts it again, with both publishers:
// nothing is lost, order per key holds, and while the server is down the
// forwarder probes with one call at a time.
func TestOutageForwarderRedis(t *testing.T) {
	for _, pub := range redisPublishers {
		for _, keys := range []int{50, 3} {
			t.Run(fmt.Sprintf("%s/keys=%d", pub.name, keys), func(t *testing.T) {
				s := testenv.StartRedisServer(t)
				plan := planOutage()
				plan.keys = keys
				plan.outage = max(plan.outage, 5*time.Second)
				forwardThroughServerOutage(t, plan, pub.new(t, s.Addr()), "outage", s, func(t *testing.T) *testenv.Collection {
					return testenv.CollectRedisStream(t, s.Addr(), "outage").Collection
				})
			})
		}
	}
}

// redisFull fills a Redis up: maxmemory 1 byte with the default
// noeviction policy refuses every write ("OOM command not allowed") and
// still serves reads, until maxmemory is lifted again.
type redisFull struct{ addr string }

func (r redisFull) set(t testing.TB, maxmemory string) {
	t.Helper()
	c := testenv.NewRedisClient(r.addr)
	defer c.Close()
	if err := c.ConfigSet(context.Background(), "maxmemory", maxmemory).Err(); err != nil {
		t.Fatalf("CONFIG SET maxmemory %s: %v", maxmemory, err)
	}
}

func (r redisFull) Stop(t testing.TB)  { r.set(t, "1") }
func (r redisFull) Start(t testing.TB) { r.set(t, "0") }

// TestForwarderRedisOutOfMemory: a Redis out of memory refuses every
// message for a while. That is not the messages' fault: the forwarder
// pauses behind one probe, as in an outage, dead-letters nothing, and goes
// on in order once Redis takes writes again.
func TestForwarderRedisOutOfMemory(t *testing.T) {
	for _, pub := range redisPublishers {
		for _, keys := range []int{50, 3} {
			t.Run(fmt.Sprintf("%s/keys=%d", pub.name, keys), func(t *testing.T) {
				s := testenv.StartRedisServer(t)
				plan := planOutage()
				plan.keys = keys
				forwardThroughServerOutage(t, plan, pub.new(t, s.Addr()), "full", redisFull{s.Addr()}, func(t *testing.T) *testenv.Collection {
					return testenv.CollectRedisStream(t, s.Addr(), "full").Collection
				})
			})
		}
	}
}
