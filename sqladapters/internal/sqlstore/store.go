package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// maxReadLimit bounds a read that over-reads to skip rows in flight, on a
// database that cannot leave them out in SQL.
const maxReadLimit = 50000

// Store implements sqladapters.Dialect on top of a Builder. Database
// packages embed it in their dialect type.
type Store struct {
	b Builder
	// emit is what the outbox without a table writes with, as the last
	// check found it (nil before one succeeded).
	emit atomic.Pointer[emitTarget]
}

var _ sqladapters.Dialect = (*Store)(nil)

// New returns the Store running b's SQL.
func New(b Builder) *Store { return &Store{b: b} }

// store lets BuilderOf find the Store embedded in a database package's
// dialect type.
func (s *Store) store() *Store { return s }

// BuilderOf returns the Builder behind a dialect of one of millbox's
// database packages, for the tests that read the plans of its statements.
func BuilderOf(d any) (Builder, bool) {
	e, ok := d.(interface{ store() *Store })
	if !ok || e.store() == nil {
		return nil, false
	}
	return e.store().b, true
}

// Name implements sqladapters.Dialect.
func (s *Store) Name() string { return s.b.Name() }

// Features implements sqladapters.Dialect.
func (s *Store) Features() sqladapters.Features {
	f := s.b.Features()
	_, f.HighWaterMark = s.b.HighWaterMark()
	_, f.Horizon = s.b.PendingHorizon()
	f.LogicalReplication = s.b.Logical() != nil
	return f
}

// OutboxTable implements sqladapters.Dialect.
func (s *Store) OutboxTable() string { return s.b.OutboxTable() }

// InboxTable implements sqladapters.Dialect.
func (s *Store) InboxTable() string { return s.b.InboxTable() }

// NotifyChannel implements sqladapters.Dialect.
func (s *Store) NotifyChannel() string { return s.b.NotifyChannel() }

// ClassifyError implements sqladapters.Dialect.
func (s *Store) ClassifyError(err error) error {
	if err == nil || errors.Is(err, sqladapters.ErrMissingTable) || errors.Is(err, sqladapters.ErrDuplicate) {
		return err // classified already
	}
	return s.b.ClassifyError(err)
}

// Migrations implements sqladapters.Dialect.
func (s *Store) Migrations() []sqladapters.Migration { return s.b.Migrations() }

// MigrationScript implements sqladapters.Dialect.
func (s *Store) MigrationScript() string {
	title := fmt.Sprintf("millbox schema for %s: outbox %s, inbox %s", s.b.Name(), s.b.OutboxTable(), s.b.InboxTable())
	return migrationScript(title, s.b.ScriptNote(), s.b.CreateSchema(), s.b.Name(), s.b.Migrations())
}

// Migrate implements sqladapters.Dialect.
func (s *Store) Migrate(ctx context.Context, tx sqladapters.Tx, migrations []sqladapters.Migration) error {
	fb := s.b.FingerprintBackfill()
	return runMigrations(ctx, tx, s.b, migrations, func(m sqladapters.Migration) error {
		if fb == nil || m.Version != fb.FingerprintVersion() {
			return nil
		}
		if err := s.backfillFingerprints(ctx, tx, fb); err != nil {
			return fmt.Errorf("migration %d (%s): fingerprint recorded errors: %w", m.Version, m.Name, err)
		}
		return nil
	})
}

// backfillFingerprints stores the fingerprint of every recorded error
// that has none, a batch at a time.
func (s *Store) backfillFingerprints(ctx context.Context, tx sqladapters.Tx, fb FingerprintBackfill) error {
	const batch = 1000
	type row struct {
		id  int64
		err string
	}
	for after := int64(0); ; {
		var rows []row
		err := s.query(ctx, tx, fb.UnfingerprintedErrors(after, batch), func(r sqladapters.Rows) error {
			var x row
			err := r.Scan(&x.id, &x.err)
			rows = append(rows, x)
			return err
		})
		if err != nil {
			return err
		}
		for _, x := range rows {
			if _, err := fb.SetFingerprint(x.id, sqladapters.FingerprintError(x.err)).Exec(ctx, tx); err != nil {
				return err
			}
		}
		if len(rows) < batch {
			return nil
		}
		after = rows[len(rows)-1].id
	}
}

// AppliedMigrations implements sqladapters.Dialect.
func (s *Store) AppliedMigrations(ctx context.Context, e sqladapters.Executor) ([]int, error) {
	out, err := appliedMigrations(ctx, e, s.b)
	return out, s.ClassifyError(err)
}

// MaxMessageBytes implements sqladapters.Dialect.
func (s *Store) MaxMessageBytes() int { return s.b.MaxMessageBytes() }

// InsertOutbox implements sqladapters.Dialect. Several statements run
// under a savepoint where the database has them, so that a failure in a
// later one takes the earlier ones back.
func (s *Store) InsertOutbox(ctx context.Context, tx sqladapters.Executor, msgs []sqladapters.OutboxMessage) error {
	if len(msgs) == 0 {
		return nil
	}
	var now, later []sqladapters.OutboxMessage
	for _, m := range msgs {
		if m.DueAt.IsZero() {
			now = append(now, m)
			continue
		}
		// Stored to the microsecond: rounding up keeps a message from
		// becoming due before its time.
		if t := m.DueAt.Truncate(time.Microsecond); t.Before(m.DueAt) {
			m.DueAt = t.Add(time.Microsecond)
		}
		later = append(later, m)
	}
	var qs []sqladapters.Query
	if len(now) > 0 {
		qs = s.b.InsertOutbox(now)
	}
	if len(later) > 0 {
		qs = append(qs, s.b.InsertScheduled(later)...)
	}
	set, rollback, release, ok := s.b.Savepoint()
	if len(qs) == 1 || !ok {
		for _, q := range qs {
			if _, err := q.Exec(ctx, tx); err != nil {
				return s.ClassifyError(err)
			}
		}
		return nil
	}
	if _, err := set.Exec(ctx, tx); err != nil {
		return s.ClassifyError(err)
	}
	for _, q := range qs {
		if _, err := q.Exec(ctx, tx); err != nil {
			return s.undo(ctx, tx, rollback, release, s.ClassifyError(err))
		}
	}
	_, err := release.Exec(ctx, tx)
	return s.ClassifyError(err)
}

// undo rolls tx back to the savepoint after err and releases it. The
// caller's context may be what failed the statement, so undo runs under a
// fresh short timeout.
func (s *Store) undo(ctx context.Context, tx sqladapters.Executor, rollback, release sqladapters.Query, err error) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, rerr := rollback.Exec(ctx, tx); rerr != nil {
		return fmt.Errorf("%w (rolling back to the savepoint failed too: %v)", err, rerr)
	}
	_, _ = release.Exec(ctx, tx)
	return err
}

// ReadPending implements sqladapters.Dialect.
func (s *Store) ReadPending(ctx context.Context, e sqladapters.Executor, q sqladapters.PendingQuery, backlog bool) ([]sqladapters.OutboxRow, error) {
	limit := q.Limit
	excludeInSQL := s.b.Features().ExcludeInSQL
	if !excludeInSQL && len(q.Exclude) > 0 {
		q.Limit = min(q.Limit+len(q.Exclude), maxReadLimit)
	}
	on := e
	setup := s.b.PendingReadSetup()
	if db, isDB := e.(sqladapters.DB); len(setup) > 0 && isDB && backlog {
		tx, err := s.readTx(ctx, db, setup)
		if err != nil {
			return nil, s.ClassifyError(err)
		}
		defer sqladapters.Rollback(tx)
		on = tx
	}
	sel, withAge := s.b.SelectPendingWithAge(q)
	if !withAge {
		sel = s.b.SelectPending(q)
	}
	rows, err := sel.Query(ctx, on)
	if err != nil {
		return nil, s.ClassifyError(err)
	}
	defer rows.Close()
	out := make([]sqladapters.OutboxRow, 0, min(q.Limit, 4096))
	// One set of scan targets for all rows: a fresh one per row would put
	// every row on the heap twice.
	var (
		r      sqladapters.OutboxRow
		key    sql.NullString
		micros sql.NullInt64
	)
	dest := []any{&r.ID, &r.Topic, &r.UUID, &r.Payload, &r.Metadata, &key, &r.Attempts, &r.KeyHash, &micros}
	if !withAge {
		dest = dest[:8]
	}
	for rows.Next() {
		r, key, micros = sqladapters.OutboxRow{}, sql.NullString{}, sql.NullInt64{}
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("scan outbox row: %w", err)
		}
		r.Key = key.String
		r.Age = time.Duration(micros.Int64) * time.Microsecond
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.ClassifyError(err)
	}
	if !excludeInSQL && len(q.Exclude) > 0 {
		out = slices.DeleteFunc(out, func(r sqladapters.OutboxRow) bool { return slices.Contains(q.Exclude, r.ID) })
		if len(out) > limit {
			out = out[:limit]
		}
	}
	return out, nil
}

// readTx begins the read-only transaction a backlog read runs in and
// applies its settings.
func (s *Store) readTx(ctx context.Context, db sqladapters.DB, setup []sqladapters.Query) (sqladapters.Tx, error) {
	tx, err := db.Begin(ctx, sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	for _, q := range setup {
		if _, err := q.Exec(ctx, tx); err != nil {
			sqladapters.Rollback(tx)
			return nil, err
		}
	}
	return tx, nil
}

// CompleteForwarded implements sqladapters.Dialect.
func (s *Store) CompleteForwarded(ctx context.Context, e sqladapters.Executor, ids []int64, keep bool) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.steps(ctx, e, s.b.CompleteForwarded(ids, keep))
}

// steps runs the statements of a move between tables (see Builder) in one
// transaction: its own when e is a DB, else a savepoint of the caller's.
// It reports the rows the first statement changed.
func (s *Store) steps(ctx context.Context, e sqladapters.Executor, qs []sqladapters.Query) (int64, error) {
	if len(qs) == 1 {
		return s.exec(ctx, e, qs[0])
	}
	return s.inTx(ctx, e, func(ex sqladapters.Executor) (int64, error) { return s.run(ctx, ex, qs) })
}

// run executes qs in order and reports the rows the first one changed.
func (s *Store) run(ctx context.Context, e sqladapters.Executor, qs []sqladapters.Query) (int64, error) {
	var first int64
	for i, q := range qs {
		n, err := q.Exec(ctx, e)
		if err != nil {
			return 0, s.ClassifyError(err)
		}
		if i == 0 {
			first = n
		}
	}
	return first, nil
}

// inTx runs fn in one transaction: its own when e is a DB, else a
// savepoint of the caller's.
func (s *Store) inTx(ctx context.Context, e sqladapters.Executor, run func(sqladapters.Executor) (int64, error)) (int64, error) {
	if db, ok := e.(sqladapters.DB); ok {
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			return 0, s.ClassifyError(err)
		}
		n, err := run(tx)
		if err != nil {
			sqladapters.Rollback(tx)
			return 0, err
		}
		return n, s.ClassifyError(tx.Commit(ctx))
	}
	set, rollback, release, ok := s.b.Savepoint()
	if !ok {
		return run(e)
	}
	if _, err := set.Exec(ctx, e); err != nil {
		return 0, s.ClassifyError(err)
	}
	n, err := run(e)
	if err != nil {
		return 0, s.undo(ctx, e, rollback, release, err)
	}
	_, err = release.Exec(ctx, e)
	return n, s.ClassifyError(err)
}

// Logical implements sqladapters.Dialect.
func (s *Store) Logical() sqladapters.Logical {
	lb := s.b.Logical()
	if lb == nil {
		return nil
	}
	return &logicalStore{s: s, b: lb}
}

// RecordFailure implements sqladapters.Dialect.
func (s *Store) RecordFailure(ctx context.Context, e sqladapters.Executor, f sqladapters.Failure) (int64, error) {
	// The error text comes from a publisher: Postgres refuses invalid
	// UTF-8 and NUL bytes, which would leave the failure unrecorded.
	f.Error = strings.ReplaceAll(strings.ToValidUTF8(f.Error, "\uFFFD"), "\x00", "")
	return s.steps(ctx, e, s.b.RecordFailure(f))
}

// HighWaterMark implements sqladapters.Dialect.
func (s *Store) HighWaterMark(ctx context.Context, e sqladapters.Executor) (int64, error) {
	q, ok := s.b.HighWaterMark()
	if !ok {
		return 0, fmt.Errorf("%w: %s has no high-water mark", errors.ErrUnsupported, s.b.Name())
	}
	return s.queryInt(ctx, e, q)
}

// PendingHorizon implements sqladapters.Dialect.
func (s *Store) PendingHorizon(ctx context.Context, e sqladapters.Executor) (sqladapters.Horizon, error) {
	var h sqladapters.Horizon
	q, ok := s.b.PendingHorizon()
	if !ok {
		return h, fmt.Errorf("%w: %s reports no horizon", errors.ErrUnsupported, s.b.Name())
	}
	var xmin, xid, cache int64
	err := s.query(ctx, e, q, func(r sqladapters.Rows) error {
		return r.Scan(&h.Mark, &xmin, &xid, &h.RetryMin, &h.HoldMin, &cache)
	})
	if err != nil {
		return sqladapters.Horizon{}, err
	}
	if cache > 1 {
		// Sessions draw ids from blocks of their own, so an id below the
		// sequence's position can still be drawn later.
		return sqladapters.Horizon{}, fmt.Errorf("%w: the outbox's id sequence hands out %d ids per session at once (CACHE %d), so ids are not drawn in order", errors.ErrUnsupported, cache, cache)
	}
	h.XMin, h.XID = uint64(xmin), uint64(xid)
	return h, nil
}

// NotifyProbe implements sqladapters.Dialect.
func (s *Store) NotifyProbe(ctx context.Context, e sqladapters.Executor) error {
	q, ok := s.b.NotifyProbe()
	if !ok || s.b.NotifyChannel() == "" {
		return fmt.Errorf("%w: the %s dialect does not notify", errors.ErrUnsupported, s.b.Name())
	}
	_, err := s.exec(ctx, e, q)
	return err
}

// OutboxStats implements sqladapters.Dialect.
func (s *Store) OutboxStats(ctx context.Context, e sqladapters.Executor) (sqladapters.OutboxStats, error) {
	var st sqladapters.OutboxStats
	var ageMicros int64
	var next sql.NullInt64
	err := s.query(ctx, e, s.b.OutboxStats(), func(r sqladapters.Rows) error {
		return r.Scan(&st.Pending, &st.Dead, &ageMicros, &st.HeldKeys, &st.Scheduled, &next)
	})
	st.OldestPendingAge = age(sql.NullInt64{Int64: ageMicros, Valid: true})
	st.NextDue = epochMicros(next)
	return st, err
}

// MoveDue implements sqladapters.Dialect.
func (s *Store) MoveDue(ctx context.Context, e sqladapters.Executor, now time.Time, limit int) (int64, time.Time, error) {
	if limit <= 0 {
		return 0, time.Time{}, fmt.Errorf("MoveDue: limit %d must be positive", limit)
	}
	now = now.Truncate(time.Microsecond)
	move := s.b.MoveDue(now, limit)
	_, ownTx := e.(sqladapters.DB)
	var (
		moved int64
		err   error
	)
	for attempt := 1; ; attempt++ {
		moved, err = s.inTx(ctx, e, func(ex sqladapters.Executor) (int64, error) { return s.move(ctx, ex, move) })
		// A caller's transaction that a deadlock rolled back cannot run
		// the move again; a transaction of the store's own can.
		if err == nil || !ownTx || attempt == moveAttempts || !s.b.RetryMove(err) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return 0, time.Time{}, err
	}
	var next sql.NullInt64
	if err := s.query(ctx, e, s.b.NextDue(), func(r sqladapters.Rows) error { return r.Scan(&next) }); err != nil {
		return moved, time.Time{}, err
	}
	return moved, epochMicros(next), nil
}

// move runs m in the transaction ex and reports the rows it moved.
func (s *Store) move(ctx context.Context, ex sqladapters.Executor, m DueMove) (int64, error) {
	if m.Lock.SQL != "" {
		if _, err := m.Lock.Exec(ctx, ex); err != nil {
			return 0, fmt.Errorf("wait for concurrent moves: %w", s.ClassifyError(err))
		}
	}
	if m.Claim.SQL == "" {
		return s.run(ctx, ex, m.Move(nil))
	}
	var ids []int64
	err := s.query(ctx, ex, m.Claim, func(r sqladapters.Rows) error {
		var id int64
		err := r.Scan(&id)
		ids = append(ids, id)
		return err
	})
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	return s.run(ctx, ex, m.Move(ids))
}

// epochMicros is the time of microseconds since the Unix epoch, zero for
// NULL.
func epochMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMicro(v.Int64).UTC()
}

// RequeueDeadLetters implements sqladapters.Dialect.
func (s *Store) RequeueDeadLetters(ctx context.Context, e sqladapters.Executor, ids []int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.steps(ctx, e, s.b.RequeueDeadLetters(ids))
}

// EnsurePartitions implements sqladapters.Dialect.
func (s *Store) EnsurePartitions(ctx context.Context, e sqladapters.Executor, n int) error {
	for _, q := range s.b.EnsurePartitions(n) {
		if _, err := s.exec(ctx, e, q); err != nil {
			return err
		}
	}
	return nil
}

// CountPartitions implements sqladapters.Dialect.
func (s *Store) CountPartitions(ctx context.Context, e sqladapters.Executor) (int, error) {
	n, err := s.queryInt(ctx, e, s.b.CountPartitions())
	return int(n), err
}

// Heartbeat implements sqladapters.Dialect.
func (s *Store) Heartbeat(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration) error {
	_, err := s.exec(ctx, e, s.b.Heartbeat(instance, ttl))
	return err
}

// HeartbeatSettings implements sqladapters.Dialect.
func (s *Store) HeartbeatSettings(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration, settings []sqladapters.Setting) error {
	mine := make(map[string]string, len(settings))
	for _, st := range settings {
		if st.Name == "" {
			return fmt.Errorf("%w: HeartbeatSettings: a setting without a name", sqladapters.ErrInvalidConfig)
		}
		if _, dup := mine[st.Name]; dup {
			return fmt.Errorf("%w: HeartbeatSettings: setting %q given twice", sqladapters.ErrInvalidConfig, st.Name)
		}
		mine[st.Name] = st.Value
	}
	enc, err := json.Marshal(mine)
	if err != nil {
		return err
	}
	if _, err := s.exec(ctx, e, s.b.HeartbeatSettings(instance, ttl, string(enc))); err != nil {
		return err
	}
	type member struct {
		instance string
		settings map[string]string
	}
	var others []member
	err = s.query(ctx, e, s.b.MemberSettings(instance), func(r sqladapters.Rows) error {
		var m member
		var text sql.NullString
		if err := r.Scan(&m.instance, &text); err != nil {
			return err
		}
		if text.Valid {
			if err := json.Unmarshal([]byte(text.String), &m.settings); err != nil {
				return fmt.Errorf("the settings the instance %q recorded are not a JSON object of strings: %w", m.instance, err)
			}
		}
		others = append(others, m)
		return nil
	})
	if err != nil {
		return err
	}
	for _, st := range settings {
		for _, m := range others {
			if theirs, ok := m.settings[st.Name]; ok && theirs != st.Value {
				return &sqladapters.SettingMismatchError{Setting: st.Name, Mine: st.Value, Theirs: theirs, Instance: m.instance}
			}
		}
	}
	return nil
}

// CountMembers implements sqladapters.Dialect.
func (s *Store) CountMembers(ctx context.Context, e sqladapters.Executor) (int, error) {
	n, err := s.queryInt(ctx, e, s.b.CountMembers())
	return int(n), err
}

// RemoveMember implements sqladapters.Dialect.
func (s *Store) RemoveMember(ctx context.Context, e sqladapters.Executor, instance string) error {
	_, err := s.exec(ctx, e, s.b.RemoveMember(instance))
	return err
}

// ClaimPartitions implements sqladapters.Dialect.
func (s *Store) ClaimPartitions(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration, max int) error {
	_, err := s.exec(ctx, e, s.b.ClaimPartitions(instance, ttl, max))
	return err
}

// RenewPartitions implements sqladapters.Dialect.
func (s *Store) RenewPartitions(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration) error {
	_, err := s.exec(ctx, e, s.b.RenewPartitions(instance, ttl))
	return err
}

// OwnedPartitions implements sqladapters.Dialect.
func (s *Store) OwnedPartitions(ctx context.Context, e sqladapters.Executor, instance string) ([]int, error) {
	var owned []int
	err := s.query(ctx, e, s.b.OwnedPartitions(instance), func(r sqladapters.Rows) error {
		var p int
		err := r.Scan(&p)
		owned = append(owned, p)
		return err
	})
	return owned, err
}

// ReleasePartitions implements sqladapters.Dialect.
func (s *Store) ReleasePartitions(ctx context.Context, e sqladapters.Executor, instance string, partitions []int) error {
	if len(partitions) == 0 {
		return nil
	}
	_, err := s.exec(ctx, e, s.b.ReleasePartitions(instance, partitions))
	return err
}

// RecordInbox implements sqladapters.Dialect.
func (s *Store) RecordInbox(ctx context.Context, e sqladapters.Executor, consumer, messageID string) (bool, error) {
	n, err := s.b.InsertInbox(consumer, messageID).Exec(ctx, e)
	return s.inboxOutcome(n, err)
}

// BeginRecordInbox implements sqladapters.Dialect.
func (s *Store) BeginRecordInbox(ctx context.Context, db sqladapters.DB, opts sql.TxOptions, consumer, messageID string) (sqladapters.Tx, bool, error) {
	be, ok := db.(sqladapters.BeginExecer)
	if !ok {
		tx, err := db.Begin(ctx, opts)
		if err != nil {
			return nil, false, fmt.Errorf("begin transaction: %w", s.ClassifyError(err))
		}
		first, err := s.RecordInbox(ctx, tx, consumer, messageID)
		if err != nil || !first {
			sqladapters.Rollback(tx)
			return nil, false, err
		}
		return tx, true, nil
	}
	q := s.b.InsertInbox(consumer, messageID)
	tx, n, err := be.BeginExec(ctx, opts, q.SQL, q.Args...)
	// When BeginExec failed it has rolled back already and tx is nil.
	first, err := s.inboxOutcome(n, err)
	if err != nil || !first {
		if tx != nil {
			sqladapters.Rollback(tx)
		}
		return nil, false, err
	}
	return tx, true, nil
}

// inboxOutcome reads the result of an inbox insert: first when it added
// the record, not first for a duplicate. A database may report the
// duplicate as a unique violation instead of zero rows.
func (s *Store) inboxOutcome(n int64, err error) (bool, error) {
	if err != nil {
		if err = s.ClassifyError(err); errors.Is(err, sqladapters.ErrDuplicate) {
			return false, nil
		}
		return false, err
	}
	switch n {
	case 1:
		return true, nil
	case 0:
		return false, nil
	default:
		return false, fmt.Errorf("the inbox insert affected %d rows, want 0 or 1", n)
	}
}

// DeleteInbox implements sqladapters.Dialect.
func (s *Store) DeleteInbox(ctx context.Context, e sqladapters.Executor, from, before time.Time, limit int) (int64, time.Time, error) {
	q, ok := s.b.DeleteInboxRange(from, before, limit)
	if !ok {
		n, err := s.exec(ctx, e, s.b.DeleteInboxBefore(before, limit))
		return n, from, err
	}
	var (
		n    int64
		last time.Time
		seen bool
	)
	err := s.query(ctx, e, q, func(r sqladapters.Rows) error {
		seen = true
		return r.Scan(&n, &last)
	})
	if err == nil && !seen {
		err = errors.New("the inbox delete returned no row")
	}
	return n, last, err
}

// exec runs q and classifies its error.
func (s *Store) exec(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (int64, error) {
	n, err := q.Exec(ctx, e)
	return n, s.ClassifyError(err)
}

// query runs q, calls scan for each row, and classifies the errors of the
// query and of the result set.
func (s *Store) query(ctx context.Context, e sqladapters.Executor, q sqladapters.Query, scan func(sqladapters.Rows) error) error {
	rows, err := q.Query(ctx, e)
	if err != nil {
		return s.ClassifyError(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return s.ClassifyError(rows.Err())
}

// queryInt runs q, which selects at most one integer.
func (s *Store) queryInt(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (int64, error) {
	var n int64
	err := s.query(ctx, e, q, func(r sqladapters.Rows) error { return r.Scan(&n) })
	return n, err
}
