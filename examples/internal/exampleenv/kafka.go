package exampleenv

import (
	"fmt"
	"os"
	"strings"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	metrics "github.com/rcrowley/go-metrics"
	"github.com/twmb/franz-go/pkg/kfake"
)

// StartKafka returns the addresses of brokers, a comma-separated list, or
// of a new in-process single-broker cluster (franz-go's kfake) if brokers
// is empty. cleanup stops the in-process cluster; on real brokers, which
// keep what a run creates, it deletes the given consumer groups and topics
// instead. Call it after the run's Kafka clients closed.
func StartKafka(brokers string) (addrs []string, cleanup func(topics, groups []string), err error) {
	// sarama's go-metrics meters cost CPU on every request and tick in a
	// goroutine that never stops; turn them off unless you export them.
	metrics.UseNilMetrics = true
	if brokers == "" {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, nil, err
		}
		return cluster.ListenAddrs(), func([]string, []string) { cluster.Close() }, nil
	}
	addrs = strings.Split(brokers, ",")
	return addrs, func(topics, groups []string) { deleteKafka(addrs, topics, groups) }, nil
}

// deleteKafka deletes consumer groups and topics from a real cluster,
// reporting failures on standard error: a failed clean-up must not fail
// the example.
func deleteKafka(addrs, topics, groups []string) {
	config := sarama.NewConfig()
	config.Version = sarama.V2_1_0_0 // deleting groups needs Kafka 1.1+
	admin, err := sarama.NewClusterAdmin(addrs, config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cleanup:", err)
		return
	}
	defer admin.Close()
	for _, g := range groups {
		if err := admin.DeleteConsumerGroup(g); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: delete consumer group %s: %v\n", g, err)
		}
	}
	for _, t := range topics {
		if err := admin.DeleteTopic(t); err != nil {
			fmt.Fprintf(os.Stderr, "cleanup: delete topic %s: %v\n", t, err)
		}
	}
}

// KafkaSubscriberConfig configures NewKafkaSubscriber.
type KafkaSubscriberConfig struct {
	// Brokers are the addresses StartKafka returned.
	Brokers []string
	// ConsumerGroup is the group the subscriber joins.
	ConsumerGroup string
	// Topics are created if they are missing, before the subscriber is
	// returned, so that nothing published to them is lost before the
	// first Subscribe.
	Topics []string
	// Partitions is the number of partitions of the topics it creates;
	// 0 means 4.
	Partitions int32
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

// NewKafkaSubscriber returns a consumer-group subscriber that reads a new
// group's topics from the oldest offset, so a group that joins after the
// first events were forwarded still sees them. It unmarshals with
// kafka.DefaultMarshaler, which reads what the partitioning marshaler
// writes; the record key is in kafka.MessageKeyFromCtx.
func NewKafkaSubscriber(c KafkaSubscriberConfig) (*kafka.Subscriber, error) {
	if c.Partitions == 0 {
		c.Partitions = 4
	}
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	config := kafka.DefaultSaramaSubscriberConfig()
	config.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers:               c.Brokers,
		Unmarshaler:           kafka.DefaultMarshaler{},
		ConsumerGroup:         c.ConsumerGroup,
		OverwriteSaramaConfig: config,
		// Demo topics; create production topics with your own tooling.
		InitializeTopicDetails: &sarama.TopicDetail{NumPartitions: c.Partitions, ReplicationFactor: 1},
	}, c.Logger)
	if err != nil {
		return nil, err
	}
	for _, topic := range c.Topics {
		if err := sub.SubscribeInitialize(topic); err != nil {
			_ = sub.Close()
			return nil, fmt.Errorf("create topic %s: %w", topic, err)
		}
	}
	return sub, nil
}
