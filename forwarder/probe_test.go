package forwarder

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestNotifyProbeIntervalDefaultAndValidation(t *testing.T) {
	c := Config{
		DB:          pgxv5.WrapConn(nil),
		Dialect:     postgres.MustNew(postgres.Options{Notify: true}),
		Destination: gochannel.NewGoChannel(gochannel.Config{}, nil),
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.Source = Polling{NotifyProbeInterval: -1}
	if err := c.Validate(); err != nil {
		t.Fatalf("probing off: %v", err)
	}
	c.Source = Polling{NotifyProbeInterval: time.Millisecond}
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Polling.NotifyProbeInterval") {
		t.Fatalf("1ms probe interval: %v", err)
	}
}
