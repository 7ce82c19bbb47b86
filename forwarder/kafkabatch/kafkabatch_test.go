package kafkabatch_test

import (
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/sqladapters"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("no brokers: %v", err)
	}
	async := kafka.DefaultSaramaSyncPublisherConfig()
	async.Producer.Return.Successes = false
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, Sarama: async}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("Return.Successes off: %v", err)
	}
}
