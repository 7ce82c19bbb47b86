package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/testenv"
)

// TestTxPublisherDeadline: a transaction ends by its context's deadline
// (the forwarder's PublishTimeout), or at TransactionTimeout when that
// comes first, on a broker that stops answering produce requests after the
// partitions were claimed; the error names the limit and wraps
// destination.ErrDestinationUnavailable, and the partition must be claimed
// again.
func TestTxPublisherDeadline(t *testing.T) {
	k := testenv.StartKafka(t)
	id := testenv.UniqueName("outbox-")
	p, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{
		Config:             kafkabatch.Config{Brokers: k.Addrs(), Options: testenv.KgoProducerOptions()},
		TransactionalID:    id,
		ControlTopic:       "progress-" + id,
		TransactionTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	ctx := testenv.Ctx(t, time.Minute)
	if err := p.PrepareTx(ctx); err != nil {
		t.Fatal(err)
	}
	for partition := range 2 {
		if _, err := p.ClaimPartition(ctx, partition); err != nil {
			t.Fatal(err)
		}
	}
	// From now on, produce requests get no answer.
	cluster := k.Cluster()
	cluster.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		return nil, nil, true
	})

	for _, tc := range []struct {
		partition int
		deadline  time.Duration
		limit     string
	}{
		{0, 300 * time.Millisecond, "the call's deadline"},
		{1, time.Hour, "TransactionTimeout"},
	} {
		t.Run(tc.limit, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
			defer cancel()
			batch := destination.TxBatch{Key: "k", Messages: []destination.TxMessage{{Topic: "orders", Message: message.NewMessage(watermill.NewUUID(), []byte("x"))}}}
			done := make(chan error, 1)
			go func() { done <- p.PublishTx(ctx, tc.partition, []destination.TxBatch{batch}, []byte("progress")) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatalf("PublishTx did not return within a minute of %s", tc.limit)
			}
			var aborted *destination.TxAbortedError
			if !errors.Is(err, destination.ErrDestinationUnavailable) || errors.As(err, &aborted) || !strings.Contains(err.Error(), tc.limit) {
				t.Fatalf("a transaction the broker does not answer: %v; want an outcome left open, unavailable, naming %s", err, tc.limit)
			}
			// The producer was closed: the outcome is the next claim's.
			if err := p.PublishTx(context.Background(), tc.partition, []destination.TxBatch{batch}, nil); err == nil || !strings.Contains(err.Error(), "not claimed") {
				t.Fatalf("PublishTx after a transaction given up: %v, want the partition not claimed", err)
			}
		})
	}
}
