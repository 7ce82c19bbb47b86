package kafkabatch_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/kafkabatch"
)

func TestConfigIsValidated(t *testing.T) {
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("no brokers: %v", err)
	}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, DeliveryTimeout: -1}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("negative DeliveryTimeout: %v", err)
	}
	notIdempotent := []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}
	if _, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}, Options: notIdempotent}); !errors.Is(err, destination.ErrInvalidConfig) {
		t.Fatalf("idempotent writes off: %v", err)
	}
}

func TestTxConfigIsValidated(t *testing.T) {
	brokers := kafkabatch.Config{Brokers: []string{"127.0.0.1:1"}}
	for name, cfg := range map[string]kafkabatch.TxConfig{
		"no TransactionalID":           {Config: brokers},
		"a slash in TransactionalID":   {Config: brokers, TransactionalID: "a/b"},
		"TransactionTimeout below 1s":  {Config: brokers, TransactionalID: "a", TransactionTimeout: time.Millisecond},
		"TransactionTimeout too short": {Config: kafkabatch.Config{Brokers: brokers.Brokers, DeliveryTimeout: time.Minute}, TransactionalID: "a"},
		"no brokers":                   {TransactionalID: "a"},
	} {
		if p, err := kafkabatch.NewTxPublisher(cfg); !errors.Is(err, destination.ErrInvalidConfig) {
			if p != nil {
				_ = p.Close()
			}
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	p, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{Config: brokers, TransactionalID: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Publish("t", message.NewMessage("u", nil)); !errors.Is(err, kafkabatch.ErrNotTransactional) {
		t.Fatalf("Publish outside a forwarder: %v", err)
	}
}
