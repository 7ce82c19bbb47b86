package testenv

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/redis/go-redis/v9"
)

// RedisAddr is the Redis server the tests use.
func RedisAddr() string { return Env("MILLBOX_REDIS_ADDR", "127.0.0.1:6379") }

// NewRedisClient returns a go-redis client for addr with its default
// settings, except a dial timeout of 3 s. The caller closes it.
func NewRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 3 * time.Second})
}

func pingRedis(addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 3 * time.Second, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// RequireRedis returns the Redis address after checking that it answers;
// when it does not, the test fails in CI and is skipped elsewhere.
func RequireRedis(t testing.TB) string {
	t.Helper()
	addr := RedisAddr()
	if err := pingRedis(addr); err != nil {
		Unavailable(t, "Redis", err)
	}
	return addr
}

// RedisStream returns a unique stream name on the test Redis, deleted
// after the test. Use it as the Watermill topic.
func RedisStream(t testing.TB) string {
	t.Helper()
	addr := RequireRedis(t)
	name := UniqueName("millbox_test_")
	t.Cleanup(func() {
		c := NewRedisClient(addr)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Del(ctx, name).Err(); err != nil {
			t.Logf("delete stream %s: %v", name, err)
		}
	})
	return name
}

// RedisPublisher returns a watermill-redisstream publisher with a client
// of its own for addr; both are closed after the test.
func RedisPublisher(t testing.TB, addr string) *redisstream.Publisher {
	t.Helper()
	p, err := redisstream.NewPublisher(redisstream.PublisherConfig{Client: NewRedisClient(addr)}, watermill.NopLogger{})
	if err != nil {
		t.Fatalf("redis publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// RedisSubscriberConfig returns watermill-redisstream's subscriber config
// for a consumer of group on client, reading each stream from its first
// entry. A group keeps its position in Redis, across client reconnects
// and server restarts (with persistence).
func RedisSubscriberConfig(client redis.UniversalClient, group string) redisstream.SubscriberConfig {
	return redisstream.SubscriberConfig{
		Client:        client,
		Consumer:      watermill.NewShortUUID(),
		ConsumerGroup: group,
		OldestId:      "0",
		// The subscriber blocks forever on its first read by default;
		// Close could then wait for a message that never comes.
		DisableIndefiniteInitialBlock: true,
	}
}

// CollectRedis records what a watermill-redisstream subscriber in a
// consumer group of its own receives on stream at addr, from its first
// entry; it is closed after the test.
func CollectRedis(t testing.TB, addr, stream string) *WatermillCollector {
	t.Helper()
	client := NewRedisClient(addr)
	sub, err := redisstream.NewSubscriber(RedisSubscriberConfig(client, UniqueName("collector_")), watermill.NopLogger{})
	if err != nil {
		t.Fatalf("redis subscriber: %v", err)
	}
	c, err := NewWatermillCollector(sub, stream)
	if err != nil {
		t.Fatalf("redis collector: %v", err)
	}
	t.Cleanup(func() {
		c.Close()
		_ = client.Close()
	})
	return c
}

// RedisServer is a redis-server the test runs on a port of its own
// (ServerProcess), for tests that stop and restart it. It persists every
// write in an append-only file before answering (appendfsync always), so a
// restart keeps every entry it acknowledged.
type RedisServer struct {
	*ServerProcess
}

// StartRedisServer starts redis-server for the test; it is stopped after
// the test. Without the binary the test fails in CI and is skipped
// elsewhere.
func StartRedisServer(t testing.TB) *RedisServer {
	t.Helper()
	p := startServerProcess(t, "redis-server", "redis-server",
		func(port int, dir string) []string {
			return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
				"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"}
		},
		func(port int) func() error {
			return func() error { return pingRedis("127.0.0.1:" + strconv.Itoa(port)) }
		})
	return &RedisServer{p}
}

// RedisStreamCollector reads a stream from its first entry with XREAD (no
// consumer group, nothing to acknowledge, so it keeps up with any
// publisher; the client reconnects after a server restart and it goes on
// after the last entry it got) and records each entry in its Collection,
// decoded as watermill-redisstream's default marshaller encodes messages.
// Offset is the entry's millisecond time, Key the KeyMetadataField
// metadata.
type RedisStreamCollector struct {
	*Collection
	client *redis.Client
	cancel context.CancelFunc
	done   chan struct{}
}

// NewRedisStreamCollector starts reading stream at addr. The caller calls
// Close.
func NewRedisStreamCollector(addr, stream string) (*RedisStreamCollector, error) {
	client := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 3 * time.Second, ReadTimeout: 5 * time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	c := &RedisStreamCollector{Collection: newCollection(), client: client, cancel: cancel, done: make(chan struct{})}
	go c.run(ctx, stream)
	return c, nil
}

func (c *RedisStreamCollector) run(ctx context.Context, stream string) {
	defer close(c.done)
	last := "0"
	var um redisstream.DefaultMarshallerUnmarshaller
	for ctx.Err() == nil {
		res, err := c.client.XRead(ctx, &redis.XReadArgs{Streams: []string{stream, last}, Count: 1000, Block: 200 * time.Millisecond}).Result()
		if err != nil {
			if err != redis.Nil && ctx.Err() == nil {
				c.setErr(err)
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		now := time.Now()
		var recs []Record
		for _, s := range res {
			for _, e := range s.Messages {
				last = e.ID
				rec := Record{Topic: stream, Metadata: map[string]string{}, Arrived: now}
				if ms, _, ok := strings.Cut(e.ID, "-"); ok {
					rec.Offset, _ = strconv.ParseInt(ms, 10, 64)
				}
				if m, err := um.Unmarshal(e.Values); err != nil {
					c.setErr(fmt.Errorf("entry %s: %w", e.ID, err))
				} else {
					rec.UUID = m.UUID
					for k, v := range m.Metadata {
						rec.Metadata[k] = v
					}
				}
				rec.Key = rec.Metadata[KeyMetadataField]
				recs = append(recs, rec)
			}
		}
		c.add(recs...)
	}
}

// Close stops reading. The records collected so far stay readable.
func (c *RedisStreamCollector) Close() {
	c.cancel()
	<-c.done
	_ = c.client.Close()
}

// CollectRedisStream starts a RedisStreamCollector for the test, closed
// after it.
func CollectRedisStream(t testing.TB, addr, stream string) *RedisStreamCollector {
	t.Helper()
	c, err := NewRedisStreamCollector(addr, stream)
	if err != nil {
		t.Fatalf("redis stream collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// DeleteRedisKeysWithPrefix deletes the keys at addr whose names start
// with prefix.
func DeleteRedisKeysWithPrefix(addr, prefix string) error {
	c := NewRedisClient(addr)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var keys []string
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) == 0 {
		return nil
	}
	return c.Del(ctx, keys...).Err()
}
