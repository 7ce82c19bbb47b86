package forwarder

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestExactlyOnceNeedsATransactionalDestination(t *testing.T) {
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer pub.Close()
	cfg := Config{DB: stdsql.WrapDB(nil), Dialect: postgres.MustNew(postgres.Options{}), Destination: pub, ExactlyOnce: true}
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "ExactlyOnce") || !strings.Contains(err.Error(), "*gochannel.GoChannel") {
		t.Fatalf("ExactlyOnce with a plain publisher: %v", err)
	}
	if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New: %v", err)
	}
	cfg.ExactlyOnce = false
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the same without ExactlyOnce: %v", err)
	}
}

func TestTxAbortedErrorFindsUnavailable(t *testing.T) {
	err := error(&TxAbortedError{Failed: map[int]error{2: errors.New("too large"), 0: DestinationUnavailable(errors.New("broker gone"))}})
	if !errors.Is(err, ErrDestinationUnavailable) {
		t.Fatalf("%v does not wrap ErrDestinationUnavailable", err)
	}
	if s := err.Error(); !strings.Contains(s, "batch 0: broker gone; batch 2: too large") {
		t.Fatalf("message %q", s)
	}
	if errors.Is(&TxAbortedError{Failed: map[int]error{1: errors.New("too large")}}, ErrDestinationUnavailable) {
		t.Fatal("a message failure reads as the destination being unavailable")
	}
}
