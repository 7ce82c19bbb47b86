package ops

import (
	"context"
	"sort"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Status is a snapshot of an installation. Counts are read by separate
// statements, so under load they may not add up exactly.
type Status struct {
	// OutboxStats sums Topics: the pending rows, dead letters and
	// scheduled messages of every topic, how long the oldest pending row
	// has waited, and the earliest due time; and counts the keys held by
	// dead letters (list them with Ops.HeldKeys).
	sqladapters.OutboxStats
	// Retrying rows are pending rows that failed at least once.
	Retrying int64
	// ForwardedKept is the number of forwarded rows kept for audit
	// (forwarder.Config.KeepForwarded).
	ForwardedKept int64
	// Topics breaks the outbox down by topic, in topic order.
	Topics []sqladapters.TopicStats

	// InboxRecords is the number of inbox records.
	InboxRecords int64
	// OldestInboxAge is the age of the oldest inbox record, 0 when none.
	OldestInboxAge time.Duration
	// Consumers breaks the inbox down by consumer, in consumer order.
	Consumers []sqladapters.ConsumerStats

	// Partitions lists the forwarder partitions in order.
	Partitions []sqladapters.PartitionLease
	// Owners lists the forwarder instances holding partitions, by name.
	Owners []Owner
}

// Owner is a forwarder instance and the partitions it holds.
type Owner struct {
	Instance   string
	Partitions []int
}

// Status reads the backlog, dead letters, kept rows, inbox records and
// partition owners.
func (o *Ops) Status(ctx context.Context) (Status, error) {
	var st Status
	var err error
	if st.Topics, err = o.d.TopicStats(ctx, o.db); err != nil {
		return Status{}, fail("status of the outbox", err)
	}
	for _, t := range st.Topics {
		st.Pending += t.Pending
		st.Retrying += t.Retrying
		st.Dead += t.Dead
		st.ForwardedKept += t.ForwardedKept
		st.OldestPendingAge = max(st.OldestPendingAge, t.OldestPendingAge)
		st.Scheduled += t.Scheduled
		if !t.NextDue.IsZero() && (st.NextDue.IsZero() || t.NextDue.Before(st.NextDue)) {
			st.NextDue = t.NextDue
		}
	}
	if st.HeldKeys, err = o.d.CountHeldKeys(ctx, o.db); err != nil {
		return Status{}, fail("status of the outbox", err)
	}
	if st.Consumers, err = o.d.InboxStats(ctx, o.db); err != nil {
		return Status{}, fail("status of the inbox", err)
	}
	for _, c := range st.Consumers {
		st.InboxRecords += c.Records
		st.OldestInboxAge = max(st.OldestInboxAge, c.OldestAge)
	}
	if st.Partitions, err = o.d.PartitionLeases(ctx, o.db); err != nil {
		return Status{}, fail("status of the partitions", err)
	}
	owned := map[string][]int{}
	for _, p := range st.Partitions {
		if p.Owner != "" {
			owned[p.Owner] = append(owned[p.Owner], p.Partition)
		}
	}
	for inst, parts := range owned {
		st.Owners = append(st.Owners, Owner{Instance: inst, Partitions: parts})
	}
	sort.Slice(st.Owners, func(i, j int) bool { return st.Owners[i].Instance < st.Owners[j].Instance })
	return st, nil
}
