package kafkabatch_test

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/sqladapters"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("no brokers: %v", err)
	}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, DeliveryTimeout: -1}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("negative DeliveryTimeout: %v", err)
	}
	notIdempotent := []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, Options: notIdempotent}); !errors.Is(err, sqladapters.ErrInvalidConfig) {
		t.Fatalf("idempotent writes off: %v", err)
	}
}
