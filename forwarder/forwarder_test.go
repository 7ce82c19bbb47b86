package forwarder

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.BatchSize != DefaultBatchSize || c.Concurrency != DefaultConcurrency || c.MaxAttempts != DefaultMaxAttempts ||
		c.Logger == nil || c.Source != (Polling{}) {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.DB") {
		t.Fatalf("missing DB: %v", err)
	}
}

// Validate accepts what New accepts: zero fields take their defaults.
func TestValidateAppliesDefaults(t *testing.T) {
	cfg := Config{
		DB:          stdsql.WrapDB(nil),
		Dialect:     postgres.MustNew(postgres.Options{}),
		Destination: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}),
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate of a config New accepts: %v", err)
	}
	cfg.BatchSize = -1
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "BatchSize") {
		t.Fatalf("Validate with BatchSize -1: %v", err)
	}
	cfg.BatchSize = 0
	cfg.Source = Polling{Partitions: -1}
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Polling.Partitions") {
		t.Fatalf("Validate with Polling.Partitions -1: %v", err)
	}
}
