package destination

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TxDestination is a destination that publishes the rows of one partition
// of the outbox in transactions together with the forwarder's progress, and
// lets a new holder of a partition fence the previous one. With
// forwarder.Config.ExactlyOnce the forwarder drives it instead of calling Publish,
// and every outbox row reaches it exactly once (see the forwarder package doc,
// Exactly once). forwarder/kafkabatch's TxPublisher implements it for
// Kafka.
//
// The forwarder calls the methods for different partitions concurrently,
// and those of one partition one at a time.
type TxDestination interface {
	message.Publisher
	// PrepareTx checks, when the forwarder starts and before it publishes
	// anything, that the destination can do what the forwarder relies on
	// (transactions, fencing, a place for progress that is never
	// deleted), and says what to change when it cannot. An error ends
	// Run.
	PrepareTx(ctx context.Context) error
	// ClaimPartition makes this process the holder of partition's
	// transactions. Every earlier holder is fenced: a transaction it has
	// open is aborted, and none it begins afterwards commits. It then
	// returns the progress that the last committed transaction of the
	// partition carried, nil when none did.
	ClaimPartition(ctx context.Context, partition int) (progress []byte, err error)
	// PublishTx publishes, in one transaction of partition, the batches'
	// messages (in order within each batch) and progress, to be returned
	// by the next ClaimPartition: all of it or none. It returns nil when
	// the transaction committed; a *TxAbortedError when it is known not to
	// have (it was aborted, or never begun), naming the batches that
	// failed; any other error when the outcome is unknown or the partition
	// was claimed by another holder (errors.Is(err, ErrFenced)). After any
	// error but a *TxAbortedError the forwarder claims the partition again
	// before it publishes more of it. It must return once ctx ends.
	PublishTx(ctx context.Context, partition int, batches []TxBatch, progress []byte) error
	// ReleasePartition lets go of what the destination holds for
	// partition's transactions. No transaction of it is in flight.
	ReleasePartition(partition int)
}

// TxBatch is the messages of one ordering key in a transaction, in the
// order they must be written.
type TxBatch struct {
	// Key is the ordering key, "" for a message without one.
	Key string
	// Messages are the batch's messages with their destination topics.
	Messages []TxMessage
}

// TxMessage is a message of a TxBatch and the topic it goes to.
type TxMessage struct {
	Topic   string
	Message *message.Message
}

// ErrFenced marks a transaction that failed because another process
// claimed its partition (TxDestination.ClaimPartition) since this one did.
var ErrFenced = errors.New("millbox: fenced: another forwarder holds the partition's transactions now")

// TxAbortedError is returned by TxDestination.PublishTx for a transaction
// that did not commit: none of its messages and not its progress are
// visible to readers of committed data.
type TxAbortedError struct {
	// Failed maps the index of each batch that failed to why; batches
	// not in it were not at fault. The forwarder sends a failed batch in
	// a transaction of its own, one message at a time, until it knows
	// which message fails; that one takes the path of any failed
	// message (retries, backoff, dead letter). An error that wraps
	// ErrDestinationUnavailable pauses all publishing behind a probe
	// instead.
	Failed map[int]error
	// Err, when set, is why the transaction was aborted besides the
	// failed batches.
	Err error
}

// Error lists the failed batches.
func (e *TxAbortedError) Error() string {
	idx := make([]int, 0, len(e.Failed))
	for i := range e.Failed {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	b.WriteString("transaction aborted")
	if e.Err != nil {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	for n, i := range idx {
		if n == 3 {
			fmt.Fprintf(&b, "; and %d more batches", len(idx)-n)
			break
		}
		fmt.Fprintf(&b, "; batch %d: %v", i, e.Failed[i])
	}
	return b.String()
}

// Unwrap returns the errors of the failed batches and Err, so that
// errors.Is finds ErrDestinationUnavailable among them.
func (e *TxAbortedError) Unwrap() []error {
	errs := make([]error, 0, len(e.Failed)+1)
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	for _, err := range e.Failed {
		errs = append(errs, err)
	}
	return errs
}
