package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp3 "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
)

func init() {
	register("rabbit", "drain N prefilled messages (200 keys, 256 B) to RabbitMQ, publisher confirms on, channel pool 64 (-channels)", runRabbit)
}

func runRabbit(ctx context.Context, o options) error {
	n := orDefault(o.n, 50000)
	db, d, cleanup, err := benchOutbox(ctx, o)
	if err != nil {
		return err
	}
	defer cleanup()
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return err
	}
	queue := fmt.Sprintf("millbox_bench_%d", time.Now().UnixNano())
	col, err := testenv.NewAMQPCollector(o.amqpURL, queue)
	if err != nil {
		return fmt.Errorf("rabbitmq at %s: %w", o.amqpURL, err)
	}
	defer func() {
		col.Close()
		_ = testenv.DeleteAMQPQueues(o.amqpURL, queue)
	}()
	cfg := testenv.AMQPConfig(o.amqpURL)
	cfg.Publish.ChannelPoolSize = orDefault(o.channels, testenv.DefaultAMQPChannelPool)
	pub, err := amqp3.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	f, err := forwarder.New(forwarder.Config{
		DB: db, Dialect: d, Publisher: pub, BatchSize: o.batch, Concurrency: o.concurrency,
		// The rows' topic is "bench"; route them to this run's queue.
		Topic: func(string, *message.Message) (string, error) { return queue, nil },
	})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	werr := col.WaitN(ctx, n, 10*time.Minute)
	elapsed := col.LastFirstArrival().Sub(start)
	_ = f.Close()
	if err := <-errc; err != nil {
		return err
	}
	if werr != nil {
		return werr
	}
	rate := float64(n) / elapsed.Seconds()
	fmt.Printf("drained %d messages from %s to RabbitMQ (watermill-amqp v3, confirms, %d channels) in %v\n",
		n, o.db, cfg.Publish.ChannelPoolSize, elapsed.Round(time.Millisecond))
	summary("rabbit_msgs_per_s", int(rate))
	return nil
}
