package main

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/forwarder/redisbatch"
	"github.com/millbox/millbox/integration/testenv"
)

// natsDest is NATS JetStream at url, with watermill-nats's publisher
// (JetStream on: each message waits for the stream's acknowledgement). A
// topic is a stream of its own, created for the run.
func natsDest(url string) benchDest {
	return benchDest{
		publisher: func() (message.Publisher, error) {
			return wmnats.NewPublisher(testenv.NATSPublisherConfig(url), watermill.NopLogger{})
		},
		collect: func(topic string) (*testenv.Collection, func(), error) {
			if err := testenv.CreateNATSStream(url, topic); err != nil {
				return nil, nil, fmt.Errorf("nats at %s: %w", url, err)
			}
			col, err := testenv.NewNATSStreamCollector(url, topic)
			if err != nil {
				_ = testenv.DeleteNATSStreams(url, topic)
				return nil, nil, err
			}
			return col.Collection, func() {
				col.Close()
				_ = testenv.DeleteNATSStreams(url, topic)
			}, nil
		},
	}
}

// redisDest is Redis at addr, with watermill-redisstream's publisher: a
// topic is a stream.
func redisDest(addr string) benchDest {
	return benchDest{
		publisher: func() (message.Publisher, error) {
			return redisstream.NewPublisher(redisstream.PublisherConfig{Client: testenv.NewRedisClient(addr)}, watermill.NopLogger{})
		},
		collect: func(topic string) (*testenv.Collection, func(), error) {
			col, err := testenv.NewRedisStreamCollector(addr, topic)
			if err != nil {
				return nil, nil, err
			}
			return col.Collection, func() {
				col.Close()
				c := testenv.NewRedisClient(addr)
				defer c.Close()
				_ = c.Del(context.Background(), topic).Err()
			}, nil
		},
	}
}

// runForwardTo is the forward case for -dest nats or redis: millbox's
// forwarder with Watermill's publisher for the destination (and, for
// Redis, with redisbatch), then Watermill's stock forwarder (watermill-sql
// → components/forwarder) with Watermill's publisher, in the same run.
func runForwardTo(ctx context.Context, o options) error {
	n := orDefault(o.n, 100000)
	dest, where := natsDest(o.natsURL), "NATS JetStream at "+o.natsURL
	if o.dest == "redis" {
		dest, where = redisDest(o.redisAddr), "Redis streams at "+o.redisAddr
	}
	fmt.Printf("draining %d messages (200 keys, 256-byte payloads) from %s to %s, %d millbox forwarder(s)\n", n, o.db, where, max(o.instances, 1))
	mill, err := millboxTo(ctx, o, dest, n)
	if err != nil {
		return fmt.Errorf("millbox: %w", err)
	}
	fmt.Printf("millbox forwarder, watermill-%s publisher: %8.0f msg/s\n", o.dest, mill)
	var batch float64
	if o.dest == "redis" {
		bdest := dest
		bdest.publisher = func() (message.Publisher, error) { return newRedisBatch(o.redisAddr) }
		if batch, err = millboxTo(ctx, o, bdest, n); err != nil {
			return fmt.Errorf("millbox with redisbatch: %w", err)
		}
		fmt.Printf("millbox forwarder, redisbatch publisher:        %8.0f msg/s\n", batch)
	}
	url := map[bool]string{true: o.mysqlDSN, false: o.pgURL}[o.db == "mysql"]
	stock, err := stockForwardTo(ctx, o.db, url, dest, n, 200, 256, 0)
	if err != nil {
		return fmt.Errorf("stock: %w", err)
	}
	fmt.Printf("watermill stock forwarder:                      %8.0f msg/s\n", stock)
	if o.dest == "redis" {
		summary("redis_msgs_per_s", int(mill), "redis_batch_msgs_per_s", int(batch), "stock_msgs_per_s", int(stock),
			"ratio", mill/stock, "ratio_batch", batch/stock)
		return nil
	}
	summary(o.dest+"_msgs_per_s", int(mill), "stock_msgs_per_s", int(stock), "ratio", mill/stock)
	return nil
}

// redisBatch is a redisbatch publisher that closes its client with it.
type redisBatch struct {
	*redisbatch.Publisher
	client *redis.Client
}

func newRedisBatch(addr string) (message.Publisher, error) {
	client := testenv.NewRedisClient(addr)
	p, err := redisbatch.NewPublisher(redisbatch.Config{Client: client})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return redisBatch{Publisher: p, client: client}, nil
}

func (r redisBatch) Close() error {
	_ = r.Publisher.Close()
	return r.client.Close()
}
