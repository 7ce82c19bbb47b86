package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/integration/testenv"
)

func init() {
	register("rabbit", "drain N prefilled messages (200 keys, 256 B) to RabbitMQ with confirms: watermill-amqp v3 and amqpbatch publishers, 64 channels (-channels)", runRabbit)
}

func runRabbit(ctx context.Context, o options) error {
	n := orDefault(o.n, 50000)
	channels := orDefault(o.channels, testenv.DefaultAMQPChannelPool)
	stock, err := rabbitOnce(ctx, o, n, func() (message.Publisher, error) {
		cfg := testenv.AMQPConfig(o.amqpURL)
		cfg.Publish.ChannelPoolSize = channels
		return amqp3.NewPublisher(cfg, watermill.NopLogger{})
	})
	if err != nil {
		return fmt.Errorf("watermill-amqp publisher: %w", err)
	}
	fmt.Printf("millbox forwarder, watermill-amqp v3 publisher (confirms, %d channels): %8.0f msg/s\n", channels, stock)
	batch, err := rabbitOnce(ctx, o, n, func() (message.Publisher, error) {
		return amqpbatch.NewPublisher(amqpbatch.Config{URL: o.amqpURL, Channels: channels})
	})
	if err != nil {
		return fmt.Errorf("amqpbatch publisher: %w", err)
	}
	fmt.Printf("millbox forwarder, amqpbatch publisher (confirms, %d channels):         %8.0f msg/s\n", channels, batch)
	summary("rabbit_msgs_per_s", int(stock), "rabbit_batch_msgs_per_s", int(batch))
	return nil
}

// rabbitOnce prefills n messages from -db and times one forwarder draining
// them to a fresh queue through the publisher newPub makes.
func rabbitOnce(ctx context.Context, o options, n int, newPub func() (message.Publisher, error)) (float64, error) {
	db, d, cleanup, err := benchOutbox(ctx, o)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return 0, err
	}
	queue := fmt.Sprintf("millbox_bench_%d", time.Now().UnixNano())
	col, err := testenv.NewAMQPCollector(o.amqpURL, queue)
	if err != nil {
		return 0, fmt.Errorf("rabbitmq at %s: %w", o.amqpURL, err)
	}
	defer func() {
		col.Close()
		_ = testenv.DeleteAMQPQueues(o.amqpURL, queue)
	}()
	pub, err := newPub()
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	f, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: pub,
		BatchSize:   o.batch,
		Concurrency: o.concurrency,
		// The rows' topic is "bench"; route them to this run's queue.
		Topic: func(string, *message.Message) (string, error) { return queue, nil },
	})
	if err != nil {
		return 0, err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	werr := col.WaitN(ctx, n, 10*time.Minute)
	elapsed := col.LastFirstArrival().Sub(start)
	_ = f.Close()
	if err := <-errc; err != nil {
		return 0, err
	}
	if werr != nil {
		return 0, werr
	}
	return float64(n) / elapsed.Seconds(), nil
}
