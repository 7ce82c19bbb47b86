package main

import (
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder/destination"
)

// broker is where the forwarder publishes and the router subscribes.
type broker struct {
	name       string
	topic      string
	publisher  message.Publisher
	subscriber message.Subscriber
	closers    []func() // run in reverse order
}

func openBroker(o options, suffix string, logger watermill.LoggerAdapter) (*broker, error) {
	if o.amqp != "" {
		return openRabbitMQ(o.amqp, "quickstart_orders_"+suffix, logger)
	}
	return openKafka(o.kafka, "quickstart.orders."+suffix, "quickstart-shipping-"+suffix, logger)
}

func (b *broker) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
}

func openKafka(brokers, topic, group string, logger watermill.LoggerAdapter) (_ *broker, err error) {
	b := &broker{name: "Kafka", topic: topic}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	// An in-process, single-broker Kafka unless -kafka names brokers. A
	// real cluster keeps topics and groups: the clean-up removes this run's
	// (closers run in reverse, so it runs last, after the clients closed).
	addrs, cleanup, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return nil, err
	}
	b.closers = append(b.closers, func() { cleanup([]string{topic}, []string{group}) })
	if brokers == "" {
		b.name = "Kafka (in process)"
	}

	// The partitioning marshaler makes the ordering key the Kafka record
	// key, so one customer's events land on one partition, in order.
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return destination.Key(msg), nil
	})
	pubConfig := kafka.DefaultSaramaSyncPublisherConfig()
	pubConfig.Producer.RequiredAcks = sarama.WaitForAll // forwarded = stored by all in-sync replicas
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               addrs,
		Marshaler:             marshaler,
		OverwriteSaramaConfig: pubConfig,
	}, logger)
	if err != nil {
		return nil, err
	}
	b.publisher = pub
	b.closers = append(b.closers, func() { _ = pub.Close() })

	// A consumer group that reads from the start; it creates the topic, so
	// nothing the forwarder publishes before the router subscribes is lost.
	sub, err := exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
		Brokers: addrs, ConsumerGroup: group, Topics: []string{topic}, Logger: logger,
	})
	if err != nil {
		return nil, err
	}
	b.subscriber = sub
	b.closers = append(b.closers, func() { _ = sub.Close() })
	return b, nil
}

func openRabbitMQ(url, queue string, logger watermill.LoggerAdapter) (_ *broker, err error) {
	b := &broker{name: "RabbitMQ", topic: queue}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	// A durable queue named after the topic, on the default exchange, with
	// persistent messages.
	config := amqp.NewDurableQueueConfig(url)
	// Publish returns only once RabbitMQ confirmed the message, so the
	// forwarder never deletes a row the broker did not take.
	config.Publish.ConfirmDelivery = true
	// The default pool size 0 opens (and puts in confirm mode) a new channel
	// for every Publish: about 0.7k msg/s. A pool lets the forwarder's
	// concurrent publishes share open channels.
	config.Publish.ChannelPoolSize = 64

	b.closers = append(b.closers, func() { exampleenv.DeleteQueue(url, queue) }) // runs last
	pub, err := amqp.NewPublisher(config, logger)
	if err != nil {
		return nil, err
	}
	b.publisher = pub
	b.closers = append(b.closers, func() { _ = pub.Close() })
	sub, err := amqp.NewSubscriber(config, logger)
	if err != nil {
		return nil, err
	}
	b.subscriber = sub
	b.closers = append(b.closers, func() { _ = sub.Close() })
	// Publish does not declare the queue, and RabbitMQ confirms and drops
	// messages routed to no queue: declare it before the forwarder starts.
	if err := sub.SubscribeInitialize(queue); err != nil {
		return nil, fmt.Errorf("declare queue %s: %w", queue, err)
	}
	return b, nil
}
