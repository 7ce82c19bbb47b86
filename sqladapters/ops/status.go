package ops

import (
	"context"
	"database/sql"
	"sort"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Status is a snapshot of an installation. Counts are read by separate
// statements, so under load they may not add up exactly.
type Status struct {
	// Pending rows wait to be forwarded, including rows waiting for a
	// retry.
	Pending int64
	// Retrying rows are pending rows that failed at least once.
	Retrying int64
	// OldestPendingAge is the age of the oldest pending row, 0 when none.
	OldestPendingAge time.Duration
	// DeadLetters is the number of dead rows.
	DeadLetters int64
	// ForwardedKept is the number of forwarded rows kept for audit
	// (forwarder.Config.KeepForwarded).
	ForwardedKept int64
	// Topics breaks the outbox down by topic, in topic order.
	Topics []TopicStatus

	// InboxRecords is the number of inbox records.
	InboxRecords int64
	// OldestInboxAge is the age of the oldest inbox record, 0 when none.
	OldestInboxAge time.Duration
	// Consumers breaks the inbox down by consumer, in consumer order.
	Consumers []ConsumerStatus

	// Partitions lists the forwarder partitions in order.
	Partitions []Partition
	// Owners lists the forwarder instances holding partitions, by name.
	Owners []Owner
}

// TopicStatus is the outbox of one topic.
type TopicStatus struct {
	Topic            string
	Pending          int64
	Retrying         int64
	OldestPendingAge time.Duration
	DeadLetters      int64
	ForwardedKept    int64
}

// ConsumerStatus is the inbox of one consumer.
type ConsumerStatus struct {
	Consumer  string
	Records   int64
	OldestAge time.Duration
}

// Partition is one forwarder partition lease.
type Partition struct {
	Partition int
	// Owner is the instance holding the lease, "" when the partition is
	// free or its lease expired.
	Owner string
	// ExpiresIn is how long the lease lasts without renewal, 0 when free.
	ExpiresIn time.Duration
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
	err := o.query(ctx, "status of the outbox", o.d.TopicStats(), func(r sqladapters.Rows) error {
		var t TopicStatus
		var age sql.NullInt64
		if err := r.Scan(&t.Topic, &t.Pending, &t.Retrying, &t.DeadLetters, &t.ForwardedKept, &age); err != nil {
			return err
		}
		t.OldestPendingAge = micros(age)
		st.Pending += t.Pending
		st.Retrying += t.Retrying
		st.DeadLetters += t.DeadLetters
		st.ForwardedKept += t.ForwardedKept
		st.OldestPendingAge = max(st.OldestPendingAge, t.OldestPendingAge)
		st.Topics = append(st.Topics, t)
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	err = o.query(ctx, "status of the inbox", o.d.InboxStats(), func(r sqladapters.Rows) error {
		var c ConsumerStatus
		var age sql.NullInt64
		if err := r.Scan(&c.Consumer, &c.Records, &age); err != nil {
			return err
		}
		c.OldestAge = micros(age)
		st.InboxRecords += c.Records
		st.OldestInboxAge = max(st.OldestInboxAge, c.OldestAge)
		st.Consumers = append(st.Consumers, c)
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	owned := map[string][]int{}
	err = o.query(ctx, "status of the partitions", o.d.PartitionLeases(), func(r sqladapters.Rows) error {
		var p Partition
		var owner sql.NullString
		var expires sql.NullInt64
		if err := r.Scan(&p.Partition, &owner, &expires); err != nil {
			return err
		}
		p.Owner, p.ExpiresIn = owner.String, micros(expires)
		if p.Owner != "" {
			owned[p.Owner] = append(owned[p.Owner], p.Partition)
		}
		st.Partitions = append(st.Partitions, p)
		return nil
	})
	if err != nil {
		return Status{}, err
	}
	for inst, parts := range owned {
		st.Owners = append(st.Owners, Owner{Instance: inst, Partitions: parts})
	}
	sort.Slice(st.Owners, func(i, j int) bool { return st.Owners[i].Instance < st.Owners[j].Instance })
	return st, nil
}
