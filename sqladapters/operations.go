package sqladapters

import "time"

// This file holds the types of the Dialect's operations verbs: what an
// operator's tools (sqladapters/ops, the admin page, the millbox command)
// read and change. Applications use them through sqladapters/ops.

// OutboxStats is the size of an outbox, or of one topic of it.
type OutboxStats struct {
	// Pending rows wait to be published, including rows waiting for a
	// retry after a failure.
	Pending int64
	// Dead counts the dead letters: messages that exhausted their
	// attempts. They live in the dead letters' table (the outbox's name
	// with _dead), not in the outbox.
	Dead int64
	// OldestPendingAge is how long the oldest pending row has waited, by
	// the database's clock, 0 when nothing is pending. A requeued dead
	// letter waits from its requeue. Dialect.OutboxStats measures the
	// pending row with the lowest id, which stands in for the oldest so
	// that the age costs an index lookup, and the lowest one never
	// requeued, so that an old row behind a fresh requeue still shows.
	OldestPendingAge time.Duration
	// HeldKeys counts the ordering keys held by a dead letter
	// (forwarder.Config.DeadLetterHoldsKey): their later messages wait
	// until it is requeued or discarded. Zero in TopicStats.
	HeldKeys int64
	// Scheduled messages wait in the scheduled table for their due time
	// (OutboxMessage.DueAt); they are not counted as pending.
	Scheduled int64
	// NextDue is the due time of the earliest scheduled message, zero when
	// none is scheduled.
	NextDue time.Time
}

// HeldKey is an ordering key held by a dead letter (see
// forwarder.Config.DeadLetterHoldsKey): a forwarder publishes none of its
// later messages until the dead letter is requeued or discarded.
type HeldKey struct {
	Key string
	// DeadLetterID is the id of the dead letter holding the key, the
	// lowest when several do.
	DeadLetterID int64
	// Held counts the key's messages waiting in the outbox behind it.
	Held int64
}

// TopicStats is the outbox of one topic.
type TopicStats struct {
	Topic string
	OutboxStats
	// Retrying rows are pending rows that failed at least once.
	Retrying int64
	// ForwardedKept rows were forwarded and kept for audit
	// (forwarder.Config.KeepForwarded).
	ForwardedKept int64
}

// ConsumerStats is the inbox of one consumer.
type ConsumerStats struct {
	Consumer string
	Records  int64
	// OldestAge is the age of the consumer's oldest record.
	OldestAge time.Duration
}

// PartitionLease is one forwarder partition's lease.
type PartitionLease struct {
	Partition int
	// Owner is the instance holding the lease, "" when the partition is
	// free or its lease expired.
	Owner string
	// ExpiresIn is how long the lease lasts without renewal, 0 when free.
	ExpiresIn time.Duration
}

// DeadLetterFilter selects dead letters. Every set field must match; the
// zero filter matches every dead letter. Ages are measured by the
// database's clock.
type DeadLetterFilter struct {
	// IDs, when not empty, limits the dead letters to these ids.
	IDs []int64
	// Topic, when set, is the exact topic.
	Topic string
	// Key, when set, is the exact ordering key.
	Key string
	// ErrorContains, when set, is a case-sensitive substring of the last
	// error.
	ErrorContains string
	// Fingerprint, when set, selects one error group: the dead letters
	// whose last error has this fingerprint (ErrorGroup.Fingerprint), read
	// through an index. The zero fingerprint selects those recorded
	// without one.
	Fingerprint *ErrorFingerprint
	// OlderThan, when positive, keeps dead letters that died longer ago
	// than this.
	OlderThan time.Duration
	// NewerThan, when positive, keeps dead letters that died within this
	// long.
	NewerThan time.Duration
	// All says that a filter which sets no other field selects every dead
	// letter on purpose. Reads take the zero filter as every dead letter
	// anyway; the operations that change dead letters (ops.Requeue and
	// ops.Discard) refuse a filter that selects every dead letter unless
	// All is set, and refuse All with any other field set, so that a
	// filter left empty by mistake (an empty id list, say) changes nothing.
	All bool
}

// IsZero reports whether f matches every dead letter: no field but All
// is set.
func (f DeadLetterFilter) IsZero() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Key == "" && f.ErrorContains == "" && f.Fingerprint == nil &&
		f.OlderThan <= 0 && f.NewerThan <= 0
}

// DeadLetterQuery is one page of dead letters.
type DeadLetterQuery struct {
	Filter DeadLetterFilter
	// AfterID leaves out the dead letters with an id up to it: pass the
	// last id of the previous page.
	AfterID int64
	// Limit is the most dead letters the page holds.
	Limit int
	// Payloads reads each dead letter's payload and metadata too. Leave it
	// false for a listing: payloads may be large, and a page of them is
	// then read only to be left unshown.
	Payloads bool
	// ErrorChars, when positive, reads at most the first ErrorChars
	// characters of each last error, which may be megabytes long, for a
	// listing that shows their start.
	ErrorChars int
}

// GroupErrorChars is how much of a group's error ErrorGroup.Error holds:
// its first characters, enough for any screen; its dead letters hold the
// whole text.
const GroupErrorChars = 4096

// ErrorGroup is the dead letters sharing one last error.
type ErrorGroup struct {
	// Fingerprint identifies the group's error; select the group with
	// DeadLetterFilter.Fingerprint. The zero fingerprint groups the dead
	// letters recorded without one, whatever their errors.
	Fingerprint ErrorFingerprint
	// Error is the last error of the group's lowest id, the same for
	// every dead letter of the group but the zero fingerprint's; at most
	// its first GroupErrorChars characters. It is "" when none was
	// recorded.
	Error string
	// Count is the number of dead letters with this error.
	Count int64
	// SampleID is the lowest id among them.
	SampleID int64
	// FirstDeadAge and LastDeadAge are how long ago the first and the
	// latest of them died.
	FirstDeadAge, LastDeadAge time.Duration
}
