package redisbatch_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/redisbatch"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := redisbatch.NewPublisher(redisbatch.Config{}); !errors.Is(err, destination.ErrInvalidConfig) || !strings.Contains(err.Error(), "Client") {
		t.Fatalf("no client: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisbatch.NewPublisher(redisbatch.Config{Client: c, Timeout: -1}); !errors.Is(err, destination.ErrInvalidConfig) || !strings.Contains(err.Error(), "Timeout") {
		t.Fatalf("negative Timeout: %v", err)
	}
}

// A server nobody listens on is an outage, not a message failure; a
// closed publisher says so.
func TestUnreachableIsUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	p, err := redisbatch.NewPublisher(redisbatch.Config{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	err = p.Publish("stream", msg)
	if !errors.Is(err, destination.ErrDestinationUnavailable) || destination.DeliveredPrefix(err, 1) != 0 {
		t.Fatalf("publish to a closed port: %v", err)
	}
	_ = p.Close()
	if err := p.Publish("stream", msg); !errors.Is(err, destination.ErrClosed) {
		t.Fatalf("publish after Close: %v", err)
	}
}
