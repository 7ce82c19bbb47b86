package kafkabatch

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// Config configures a Publisher.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Marshaler turns messages into Kafka records. Defaults to
	// watermill-kafka's partitioning marshaler keyed by the metadata
	// field forwarder.DefaultKeyMetadataField.
	Marshaler kafka.Marshaler
	// Sarama is the producer config. Defaults to watermill-kafka's
	// DefaultSaramaSyncPublisherConfig with Net.MaxOpenRequests = 1, so
	// that a retried request can never overtake a later one and records
	// of one partition keep their order.
	Sarama *sarama.Config
}

// Publisher sends each Publish call's messages as one batch.
type Publisher struct {
	producer  sarama.SyncProducer
	marshaler kafka.Marshaler
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher connects to the brokers.
func NewPublisher(cfg Config) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: kafkabatch.Config.Brokers is required", sqladapters.ErrInvalidConfig)
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get(forwarder.DefaultKeyMetadataField), nil
		})
	}
	if cfg.Sarama == nil {
		cfg.Sarama = kafka.DefaultSaramaSyncPublisherConfig()
		cfg.Sarama.Net.MaxOpenRequests = 1
	}
	if !cfg.Sarama.Producer.Return.Successes {
		return nil, fmt.Errorf("%w: kafkabatch.Config.Sarama.Producer.Return.Successes must be true for a synchronous producer", sqladapters.ErrInvalidConfig)
	}
	producer, err := sarama.NewSyncProducer(cfg.Brokers, cfg.Sarama)
	if err != nil {
		return nil, fmt.Errorf("millbox: kafkabatch: connect to %v: %w", cfg.Brokers, err)
	}
	return &Publisher{producer: producer, marshaler: cfg.Marshaler}, nil
}

// Publish sends msgs to topic in one batch and returns once Kafka
// acknowledged all of them. An error means some may have been written:
// publish them again (at least once).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	records := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		r, err := p.marshaler.Marshal(topic, m)
		if err != nil {
			return fmt.Errorf("millbox: kafkabatch: marshal message %s: %w", m.UUID, err)
		}
		records[i] = r
	}
	if err := p.producer.SendMessages(records); err != nil {
		var perr sarama.ProducerErrors
		if errors.As(err, &perr) && len(perr) > 0 {
			return fmt.Errorf("millbox: kafkabatch: %d of %d messages to %s failed, first: %w", len(perr), len(msgs), topic, perr[0].Err)
		}
		return fmt.Errorf("millbox: kafkabatch: send %d messages to %s: %w", len(msgs), topic, err)
	}
	return nil
}

// Close closes the producer.
func (p *Publisher) Close() error { return p.producer.Close() }
