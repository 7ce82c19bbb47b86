package amqpbatch_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/destination"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := amqpbatch.NewPublisher(amqpbatch.Config{}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("no URL: %v", err)
	}
	if _, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: "amqp://x", Channels: -1}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("negative channels: %v", err)
	}
	if _, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: "amqp://x", ConfirmTimeout: -1}); !errors.Is(err, destination.ErrInvalidConfig) || !strings.Contains(err.Error(), "ConfirmTimeout") {
		t.Fatalf("negative ConfirmTimeout: %v", err)
	}
}
