package main

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	metrics "github.com/rcrowley/go-metrics"
	"github.com/twmb/franz-go/pkg/kfake"
)

// duplicatingPublisher publishes every tenth event named name twice, as a
// producer that lost an ack and retried would.
type duplicatingPublisher struct {
	message.Publisher
	name      string
	seen      atomic.Int64
	sentTwice atomic.Int64
}

func (p *duplicatingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Metadata.Get("name") == p.name && p.seen.Add(1)%10 == 1 {
			if err := p.Publisher.Publish(topic, m.Copy()); err != nil {
				return err
			}
			p.sentTwice.Add(1)
		}
	}
	return nil
}

// startKafka returns the addresses of the -kafka brokers, or of a new
// in-process cluster, and a function that removes the run's topics and
// groups (from a real cluster) or stops the in-process one.
func startKafka(brokers string) ([]string, func(topics, groups []string), error) {
	metrics.UseNilMetrics = true // sarama's go-metrics: CPU per request and a goroutine that never stops
	if brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, nil, err
		}
		return cluster.ListenAddrs(), func([]string, []string) { cluster.Close() }, nil
	}
	addrs := strings.Split(brokers, ",")
	return addrs, func(topics, groups []string) {
		config := sarama.NewConfig()
		config.Version = sarama.V2_1_0_0
		admin, err := sarama.NewClusterAdmin(addrs, config)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
			return
		}
		defer admin.Close()
		for _, g := range groups {
			_ = admin.DeleteConsumerGroup(g)
		}
		for _, t := range topics {
			_ = admin.DeleteTopic(t)
		}
	}, nil
}

// newSubscriber returns a consumer-group subscriber that starts from the
// oldest offset, and creates topics (as demo topics) if they are missing.
func newSubscriber(addrs []string, group string, topics ...string) (*kafka.Subscriber, error) {
	config := kafka.DefaultSaramaSubscriberConfig()
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:                addrs,
		Unmarshaler:            kafka.DefaultMarshaler{},
		ConsumerGroup:          group,
		OverwriteSaramaConfig:  config,
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: 4, ReplicationFactor: 1},
	}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	for _, topic := range topics {
		if err := sub.SubscribeInitialize(topic); err != nil {
			_ = sub.Close()
			return nil, err
		}
	}
	return sub, nil
}
