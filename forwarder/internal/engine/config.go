package engine

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/sqladapters"
)

// Config is the engine's part of the forwarder's settings, validated and
// with defaults applied by the forwarder.
type Config struct {
	DB          sqladapters.DB
	Dialect     sqladapters.Dialect
	Destination message.Publisher
	// Tx is the destination in exactly-once mode; nil otherwise.
	Tx destination.TxDestination
	// Topic maps a row's topic to the destination topic; nil keeps it.
	Topic func(topic string, msg *message.Message) (string, error)

	BatchSize    int // rows queued on lanes before the source takes more
	Concurrency  int // calls in flight
	PublishBatch int // rows of one lane in one call
	// PublishTimeout bounds a call: when it passes, the call's context is
	// cancelled and the call counts as failed; its keys stay held until
	// it returns.
	PublishTimeout time.Duration
	CloseTimeout   time.Duration

	// Retry paces a failed row's next attempt; MaxAttempts (> 0) moves it
	// to the dead letters after that many.
	Retry              retry.Policy
	MaxAttempts        int
	DeadLetterHoldsKey bool
	KeepForwarded      bool

	Logger   watermill.LoggerAdapter
	Observer Observer
	// Started is called once the source runs.
	Started func()
}

// Observer is told what the engine does; the forwarder turns it into
// metrics, spans and the user's hooks. Its methods are called from the
// engine's goroutines and must be fast and safe for concurrent use.
type Observer interface {
	// StartSend starts the span of one destination call of msgs, the
	// first of which goes to topic. The messages carry the returned
	// context; end is called with the call's error.
	StartSend(ctx context.Context, topic string, msgs []*message.Message) (_ context.Context, end func(error))
	// Called reports how long one call to topic took and what it returned.
	Called(ctx context.Context, topic string, took time.Duration, err error)
	// Sent reports n messages to topic acknowledged by the destination,
	// Failed n messages whose call failed with err.
	Sent(topic string, n int)
	Failed(topic string, n int, err error)
	// Acked reports, for one message of topic, the time from its row's
	// creation to the destination's acknowledgement.
	Acked(topic string, age time.Duration)
	// Batch reports one call (or, exactly once, one transaction).
	Batch(Batch)
	// Failure reports a failed attempt of a row; Dead when it moved to
	// the dead letters.
	Failure(Failure)
	// Error reports an error the engine retries.
	Error(err error)
}

// Batch is one call of the destination as Observer.Batch reports it.
type Batch struct {
	Messages, Forwarded, Failed int
	Duration                    time.Duration
}

// Failure is one failed attempt of a row as Observer.Failure reports it.
// ID is 0 for a row in no table.
type Failure struct {
	ID               int64
	UUID, Topic, Key string
	Attempts         int
	Error            string
	Backoff          time.Duration
	Dead             bool
}
