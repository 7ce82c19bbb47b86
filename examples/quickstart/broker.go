package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	metrics "github.com/rcrowley/go-metrics"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/millbox/millbox/forwarder"
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
	// sarama's go-metrics meters cost CPU on every request and tick in a
	// goroutine that never stops; turn them off unless you export them.
	metrics.UseNilMetrics = true

	b := &broker{name: "Kafka", topic: topic}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	addrs := strings.Split(brokers, ",")
	if brokers == "" {
		// An in-process, single-broker Kafka on a random port.
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, err
		}
		b.closers = append(b.closers, cluster.Close)
		b.name, addrs = "Kafka (in process)", cluster.ListenAddrs()
	} else {
		// A real cluster keeps topics and groups: remove this run's at
		// the end (closers run in reverse, so this one runs last).
		b.closers = append(b.closers, func() { deleteKafkaTopic(addrs, topic, group) })
	}

	// The partitioning marshaler makes the ordering key the Kafka record
	// key, so one customer's events land on one partition, in order.
	marshaler := kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return msg.Metadata.Get(forwarder.DefaultKeyMetadataField), nil
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

	subConfig := kafka.DefaultSaramaSubscriberConfig()
	subConfig.Consumer.Offsets.Initial = sarama.OffsetOldest // a new group reads from the start
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               addrs,
		Unmarshaler:           marshaler,
		ConsumerGroup:         group,
		OverwriteSaramaConfig: subConfig,
		// Demo topic; create production topics with your own tooling.
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1},
	}, logger)
	if err != nil {
		return nil, err
	}
	b.subscriber = sub
	b.closers = append(b.closers, func() { _ = sub.Close() })
	if err := sub.SubscribeInitialize(topic); err != nil {
		return nil, fmt.Errorf("create topic %s: %w", topic, err)
	}
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

	b.closers = append(b.closers, func() { // runs last
		if err := deleteQueue(url, queue); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
		}
	})
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

func deleteKafkaTopic(addrs []string, topic, group string) {
	config := sarama.NewConfig()
	config.Version = sarama.V2_1_0_0 // deleting groups needs Kafka 1.1+
	admin, err := sarama.NewClusterAdmin(addrs, config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		return
	}
	defer admin.Close()
	if err := admin.DeleteTopic(topic); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup: delete topic:", err)
	}
	if err := admin.DeleteConsumerGroup(group); err != nil {
		fmt.Fprintln(os.Stderr, "cleanup: delete consumer group:", err)
	}
}

func deleteQueue(url, queue string) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	_, err = ch.QueueDelete(queue, false, false, false)
	return err
}
