package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// This file runs the statements of the operations verbs.

// maxPage bounds every page, batch and group limit of the operations
// verbs.
const maxPage = 50000

func checkLimit(limit int) error {
	if limit < 1 || limit > maxPage {
		return fmt.Errorf("%w: a limit must be between 1 and %d, got %d", sqladapters.ErrInvalidConfig, maxPage, limit)
	}
	return nil
}

// age turns microseconds measured by the database into a duration: 0 for
// NULL, and 0 for a moment ago by a database clock that stepped back.
func age(micros sql.NullInt64) time.Duration {
	if !micros.Valid || micros.Int64 < 0 {
		return 0
	}
	return time.Duration(micros.Int64) * time.Microsecond
}

// fingerprint reads a fingerprint column: NULL (or anything but 16 bytes)
// is the zero fingerprint.
func fingerprint(b []byte) sqladapters.ErrorFingerprint {
	var f sqladapters.ErrorFingerprint
	if len(b) == len(f) {
		copy(f[:], b)
	}
	return f
}

// CurrentSchema implements sqladapters.Dialect.
func (s *Store) CurrentSchema(ctx context.Context, e sqladapters.Executor) (string, error) {
	name, current := s.b.Schema()
	if name != "" || current.SQL == "" {
		return name, nil
	}
	var cur sql.NullString
	err := s.query(ctx, e, current, func(r sqladapters.Rows) error { return r.Scan(&cur) })
	return cur.String, err
}

// TopicStats implements sqladapters.Dialect.
func (s *Store) TopicStats(ctx context.Context, e sqladapters.Executor) ([]sqladapters.TopicStats, error) {
	var out []sqladapters.TopicStats
	err := s.query(ctx, e, s.b.TopicStats(), func(r sqladapters.Rows) error {
		var t sqladapters.TopicStats
		var oldest, next sql.NullInt64
		if err := r.Scan(&t.Topic, &t.Pending, &t.Retrying, &t.Dead, &t.ForwardedKept, &oldest, &t.Scheduled, &next); err != nil {
			return err
		}
		t.OldestPendingAge = age(oldest)
		t.NextDue = epochMicros(next)
		out = append(out, t)
		return nil
	})
	return out, err
}

// InboxStats implements sqladapters.Dialect.
func (s *Store) InboxStats(ctx context.Context, e sqladapters.Executor) ([]sqladapters.ConsumerStats, error) {
	var out []sqladapters.ConsumerStats
	err := s.query(ctx, e, s.b.InboxStats(), func(r sqladapters.Rows) error {
		var c sqladapters.ConsumerStats
		var oldest sql.NullInt64
		if err := r.Scan(&c.Consumer, &c.Records, &oldest); err != nil {
			return err
		}
		c.OldestAge = age(oldest)
		out = append(out, c)
		return nil
	})
	return out, err
}

// PartitionLeases implements sqladapters.Dialect.
func (s *Store) PartitionLeases(ctx context.Context, e sqladapters.Executor) ([]sqladapters.PartitionLease, error) {
	var out []sqladapters.PartitionLease
	err := s.query(ctx, e, s.b.PartitionLeases(), func(r sqladapters.Rows) error {
		var p sqladapters.PartitionLease
		var owner sql.NullString
		var expires sql.NullInt64
		if err := r.Scan(&p.Partition, &owner, &expires); err != nil {
			return err
		}
		p.Owner, p.ExpiresIn = owner.String, age(expires)
		out = append(out, p)
		return nil
	})
	return out, err
}

// ListDeadLetters implements sqladapters.Dialect.
func (s *Store) ListDeadLetters(ctx context.Context, e sqladapters.Executor, q sqladapters.DeadLetterQuery) ([]sqladapters.DeadLetter, error) {
	if err := checkLimit(q.Limit); err != nil {
		return nil, err
	}
	var out []sqladapters.DeadLetter
	err := s.query(ctx, e, s.b.SelectDeadLetters(q), func(r sqladapters.Rows) error {
		var (
			dl  sqladapters.DeadLetter
			key sql.NullString
		)
		var fp []byte
		dest := []any{&dl.ID, &dl.Topic, &dl.UUID, &key, &dl.Attempts, &dl.LastError, &fp, &dl.CreatedAt, &dl.DeadAt, &dl.Holds}
		if q.Payloads {
			dest = append(dest, &dl.Payload, &dl.Metadata)
		}
		if err := r.Scan(dest...); err != nil {
			return fmt.Errorf("scan dead letter: %w", err)
		}
		dl.Key, dl.Fingerprint = key.String, fingerprint(fp)
		out = append(out, dl)
		return nil
	})
	return out, err
}

// DeadLetterIDs implements sqladapters.Dialect.
func (s *Store) DeadLetterIDs(ctx context.Context, e sqladapters.Executor, f sqladapters.DeadLetterFilter, afterID int64, limit int) ([]int64, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	return s.queryIDs(ctx, e, s.b.SelectDeadLetterIDs(f, afterID, limit))
}

// HeldKeys implements sqladapters.Dialect.
func (s *Store) HeldKeys(ctx context.Context, e sqladapters.Executor, limit int) ([]sqladapters.HeldKey, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	var out []sqladapters.HeldKey
	err := s.query(ctx, e, s.b.SelectHeldKeys(limit), func(r sqladapters.Rows) error {
		var k sqladapters.HeldKey
		if err := r.Scan(&k.Key, &k.DeadLetterID, &k.Held); err != nil {
			return fmt.Errorf("scan held key: %w", err)
		}
		out = append(out, k)
		return nil
	})
	return out, err
}

// CountHeldKeys implements sqladapters.Dialect.
func (s *Store) CountHeldKeys(ctx context.Context, e sqladapters.Executor) (int64, error) {
	return s.queryInt(ctx, e, s.b.CountHeldKeys())
}

// CountDeadLetters implements sqladapters.Dialect.
func (s *Store) CountDeadLetters(ctx context.Context, e sqladapters.Executor, f sqladapters.DeadLetterFilter) (int64, error) {
	return s.queryInt(ctx, e, s.b.CountDeadLetters(f))
}

// GroupDeadLetters implements sqladapters.Dialect.
func (s *Store) GroupDeadLetters(ctx context.Context, e sqladapters.Executor, f sqladapters.DeadLetterFilter, limit int) ([]sqladapters.ErrorGroup, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	var out []sqladapters.ErrorGroup
	err := s.query(ctx, e, s.b.GroupDeadLetters(f, limit), func(r sqladapters.Rows) error {
		var g sqladapters.ErrorGroup
		var fp []byte
		var first, last sql.NullInt64
		if err := r.Scan(&fp, &g.Error, &g.Count, &g.SampleID, &first, &last); err != nil {
			return err
		}
		g.Fingerprint, g.FirstDeadAge, g.LastDeadAge = fingerprint(fp), age(first), age(last)
		out = append(out, g)
		return nil
	})
	return out, err
}

// DiscardDeadLetters implements sqladapters.Dialect.
func (s *Store) DiscardDeadLetters(ctx context.Context, e sqladapters.Executor, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.exec(ctx, e, s.b.DeleteDeadLetters(ids))
}

// CountForwardedBefore implements sqladapters.Dialect.
func (s *Store) CountForwardedBefore(ctx context.Context, e sqladapters.Executor, t time.Time) (int64, error) {
	return s.queryInt(ctx, e, s.b.CountForwardedBefore(t))
}

// ForwardedIDsBefore implements sqladapters.Dialect.
func (s *Store) ForwardedIDsBefore(ctx context.Context, e sqladapters.Executor, t time.Time, afterID int64, limit int) ([]int64, error) {
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	return s.queryIDs(ctx, e, s.b.SelectForwardedIDs(t, afterID, limit))
}

// DeleteForwarded implements sqladapters.Dialect.
func (s *Store) DeleteForwarded(ctx context.Context, e sqladapters.Executor, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.exec(ctx, e, s.b.DeleteForwarded(ids))
}

// CountInboxBefore implements sqladapters.Dialect.
func (s *Store) CountInboxBefore(ctx context.Context, e sqladapters.Executor, t time.Time) (int64, error) {
	return s.queryInt(ctx, e, s.b.CountInboxBefore(t))
}

// queryIDs runs q, which selects one id column.
func (s *Store) queryIDs(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) ([]int64, error) {
	var ids []int64
	err := s.query(ctx, e, q, func(r sqladapters.Rows) error {
		var id int64
		if err := r.Scan(&id); err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	return ids, err
}
