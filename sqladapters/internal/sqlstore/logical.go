package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// logicalStore executes a Logical builder's statements: the store of the
// change-data-capture source.
type logicalStore struct {
	s *Store
	b Logical
}

var _ sqladapters.Logical = (*logicalStore)(nil)

// Check implements sqladapters.Logical.
func (l *logicalStore) Check(ctx context.Context, e sqladapters.Executor, publication, slot string) (sqladapters.LogicalStatus, error) {
	var st sqladapters.LogicalStatus
	err := l.s.query(ctx, e, l.b.LogicalCheck(publication, slot), func(r sqladapters.Rows) error {
		var oid int64
		if err := r.Scan(&st.WalLevel, &st.Role, &st.Replication, &oid, &st.Publication, &st.Slot, &st.ServerVersion, &st.MaxSlotWALKeepSize,
			&st.SlotFailover, &st.Standbys); err != nil {
			return err
		}
		st.TableOID = uint32(oid)
		return nil
	})
	return st, err
}

// CreatePublication implements sqladapters.Logical.
func (l *logicalStore) CreatePublication(ctx context.Context, e sqladapters.Executor, publication string) error {
	exists, err := l.exists(ctx, e, l.b.PublicationExists(publication))
	if err != nil || exists {
		return err
	}
	if _, err := l.b.CreatePublication(publication).Exec(ctx, e); err != nil && !l.b.IsDuplicateObject(err) {
		return l.s.ClassifyError(err)
	}
	return nil
}

// CreateSlot implements sqladapters.Logical.
func (l *logicalStore) CreateSlot(ctx context.Context, e sqladapters.Executor, slot string, failover bool) error {
	exists, err := l.exists(ctx, e, l.b.SlotExists(slot))
	if err != nil || exists {
		return err
	}
	if err := l.s.query(ctx, e, l.b.CreateSlot(slot, failover), func(sqladapters.Rows) error { return nil }); err != nil && !l.b.IsDuplicateObject(err) {
		return err
	}
	return nil
}

// Drop implements sqladapters.Logical.
func (l *logicalStore) Drop(ctx context.Context, e sqladapters.Executor, publication, slot string) error {
	if err := l.s.query(ctx, e, l.b.DropSlot(slot), func(sqladapters.Rows) error { return nil }); err != nil {
		return fmt.Errorf("drop replication slot %s: %w", slot, err)
	}
	if _, err := l.b.DropPublication(publication).Exec(ctx, e); err != nil {
		return fmt.Errorf("drop publication %s: %w", publication, err)
	}
	return nil
}

func (l *logicalStore) exists(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (bool, error) {
	var v bool
	err := l.s.query(ctx, e, q, func(r sqladapters.Rows) error { return r.Scan(&v) })
	return v, err
}

// Slot implements sqladapters.Logical.
func (l *logicalStore) Slot(ctx context.Context, e sqladapters.Executor, slot string) (st sqladapters.SlotState, ok bool, err error) {
	err = l.s.query(ctx, e, l.b.Slot(slot), func(r sqladapters.Rows) error {
		var confirmed sql.NullString
		var lag sql.NullInt64
		if err := r.Scan(&confirmed, &st.Active, &lag); err != nil {
			return err
		}
		if !confirmed.Valid {
			return fmt.Errorf("millbox: slot %s is not a logical slot", slot)
		}
		ok = true
		st.Lag = lag.Int64
		st.Confirmed, err = strconv.ParseUint(confirmed.String, 10, 64)
		return err
	})
	return st, ok, err
}

// scanMark parses a mark's columns.
func scanMark(lsn string, xmin, emits int64) (sqladapters.StreamMark, error) {
	v, err := strconv.ParseUint(lsn, 10, 64)
	if err != nil {
		return sqladapters.StreamMark{}, fmt.Errorf("millbox: position %q: %w", lsn, err)
	}
	return sqladapters.StreamMark{LSN: v, XMin: uint64(xmin), Emits: emits}, nil
}

// PendingKeys implements sqladapters.Logical.
func (l *logicalStore) PendingKeys(ctx context.Context, e sqladapters.Executor, holds bool) (mark sqladapters.StreamMark, keys []sqladapters.StreamKey, err error) {
	err = l.s.query(ctx, e, l.b.PendingKeys(holds), func(r sqladapters.Rows) error {
		var lsn string
		var xmin, emits int64
		var keyed sql.NullBool
		var key sql.NullString
		if err := r.Scan(&lsn, &xmin, &emits, &keyed, &key); err != nil {
			return err
		}
		if mark, err = scanMark(lsn, xmin, emits); err != nil {
			return err
		}
		if keyed.Valid {
			keys = append(keys, sqladapters.StreamKey{Key: key.String, Keyed: keyed.Bool})
		}
		return nil
	})
	return mark, keys, err
}

// ReadKeys implements sqladapters.Logical.
func (l *logicalStore) ReadKeys(ctx context.Context, e sqladapters.Executor, keys []string, unkeyed bool, limit int, holds bool) (mark sqladapters.StreamMark, rows []sqladapters.KeyedRow, err error) {
	err = l.s.query(ctx, e, l.b.ReadKeys(keys, unkeyed, limit, holds), func(r sqladapters.Rows) error {
		var lsn string
		var xmin, emits int64
		var id, attempts, age sql.NullInt64
		var topic, uuid, md, key sql.NullString
		var payload []byte
		var due, held sql.NullBool
		var wait sql.NullFloat64
		if err := r.Scan(&lsn, &xmin, &emits, &id, &topic, &uuid, &payload, &md, &key, &attempts, &due, &wait, &age, &held); err != nil {
			return err
		}
		if mark, err = scanMark(lsn, xmin, emits); err != nil {
			return err
		}
		if !id.Valid {
			return nil
		}
		row := sqladapters.KeyedRow{Keyed: key.Valid, Due: due.Bool, Wait: time.Duration(wait.Float64 * float64(time.Second)), Holds: held.Bool}
		row.ID, row.Topic, row.UUID, row.Payload, row.Metadata = id.Int64, topic.String, uuid.String, payload, []byte(md.String)
		row.Key, row.Attempts, row.Age = key.String, int(attempts.Int64), time.Duration(age.Int64)*time.Microsecond
		rows = append(rows, row)
		return nil
	})
	return mark, rows, err
}

// EmitCheckInterval is how long a check of what the outbox without a
// table writes with (its prefix and id sequence, the server's version and
// wal_level) holds: a publisher writing without a table checks at most
// this often, so that it costs one statement per call. Whether a slot can
// read the messages is never cached: the statement writing them looks.
const EmitCheckInterval = 10 * time.Second

// emitTarget is the prefix and sequence the outbox without a table writes
// with, and when the server was last found able to deliver them.
type emitTarget struct {
	prefix, sequence string
	emits            string // the count of calls, "" before migration 9
	checked          time.Time
}

// errNoSlot is Emit's error where no logical slot can read the records.
var errNoSlot = fmt.Errorf("%w: %w: no forwarder could read the messages; nothing was written (the outbox Publisher writes them into the table instead; "+
	"create the forwarder's slot with cdc.Setup, or set cdc.Source.CreateIfMissing and start it)",
	sqladapters.ErrEmitUnavailable, sqladapters.ErrEmitNoSlot)

// Emit implements sqladapters.Logical. Each record's statement writes it
// only where a logical slot can read it, so that no record commits that
// none could (a stale check would let it, after a failover to a standby
// without the slot). Several records are written under a savepoint, so
// that a failure of a later one, or a slot gone between two of them,
// takes the earlier ones back.
func (l *logicalStore) Emit(ctx context.Context, tx sqladapters.Executor, records []sqladapters.EmitRecord) error {
	if len(records) == 0 {
		return nil
	}
	t, err := l.emitTarget(ctx, tx)
	if err != nil {
		return err
	}
	emit := func(r sqladapters.EmitRecord) error {
		var wrote bool
		if err := l.s.query(ctx, tx, l.b.EmitRecord(t.prefix, t.sequence, t.emits, r), func(sqladapters.Rows) error { wrote = true; return nil }); err != nil {
			return err
		}
		if !wrote {
			return errNoSlot
		}
		return nil
	}
	set, rollback, release, ok := l.s.b.Savepoint()
	if len(records) == 1 || !ok {
		for _, r := range records {
			if err := emit(r); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := set.Exec(ctx, tx); err != nil {
		return l.s.ClassifyError(err)
	}
	for _, r := range records {
		if err := emit(r); err != nil {
			return l.s.undo(ctx, tx, rollback, release, err)
		}
	}
	_, err = release.Exec(ctx, tx)
	return l.s.ClassifyError(err)
}

// emitTarget returns what the outbox without a table writes with, checking
// at most every EmitCheckInterval that the server can deliver it, or says
// why it cannot.
func (l *logicalStore) emitTarget(ctx context.Context, tx sqladapters.Executor) (*emitTarget, error) {
	if t := l.s.emit.Load(); t != nil && time.Since(t.checked) < EmitCheckInterval {
		return t, nil
	}
	var (
		walLevel         string
		version          int
		prefix, sequence sql.NullString
		emits            sql.NullString
		seen             bool
	)
	err := l.s.query(ctx, tx, l.b.EmitCheck(), func(r sqladapters.Rows) error {
		seen = true
		return r.Scan(&walLevel, &version, &prefix, &sequence, &emits)
	})
	switch {
	case err != nil:
		return nil, err
	case !seen:
		return nil, errors.New("millbox: the emit check returned no row")
	case !prefix.Valid || !sequence.Valid:
		return nil, &sqladapters.MissingTableError{Dialect: l.s.b.Name(), Err: fmt.Errorf("relation %s or its id sequence does not exist", l.s.b.OutboxTable())}
	case version < 140000:
		return nil, fmt.Errorf("%w: PostgreSQL %d.%d cannot stream logical decoding messages to the forwarder (it needs 14 or later); nothing was written",
			sqladapters.ErrEmitUnavailable, version/10000, version%10000)
	case walLevel != "logical":
		return nil, fmt.Errorf("%w: wal_level is %q, not logical: no replication slot could read the messages; nothing was written (ALTER SYSTEM SET wal_level = logical, then restart PostgreSQL)",
			sqladapters.ErrEmitUnavailable, walLevel)
	}
	t := &emitTarget{prefix: prefix.String, sequence: sequence.String, emits: emits.String, checked: time.Now()}
	l.s.emit.Store(t)
	return t, nil
}

// WriteMessages implements sqladapters.Logical.
func (l *logicalStore) WriteMessages(ctx context.Context, db sqladapters.DB, ms []sqladapters.WrittenMessage) (xid uint32, err error) {
	if len(ms) == 0 {
		return 0, nil
	}
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return 0, l.s.ClassifyError(err)
	}
	defer func() {
		if err != nil {
			sqladapters.Rollback(tx)
		}
	}()
	qs := l.b.WriteMessages(ms)
	for _, q := range qs[:len(qs)-1] {
		if _, err = l.s.exec(ctx, tx, q); err != nil {
			return 0, err
		}
	}
	var x int64
	if x, err = l.s.queryInt(ctx, tx, qs[len(qs)-1]); err != nil {
		return 0, err
	}
	if err = tx.Commit(ctx); err != nil {
		return 0, l.s.ClassifyError(err)
	}
	return uint32(x), nil
}

// CompleteStreamed implements sqladapters.Logical.
func (l *logicalStore) CompleteStreamed(ctx context.Context, e sqladapters.Executor, ids []int64, keep bool) (found []int64, xmin uint64, err error) {
	err = l.s.query(ctx, e, l.b.CompleteStreamed(ids, keep), func(r sqladapters.Rows) error {
		var x int64
		var id sql.NullInt64
		if err := r.Scan(&x, &id); err != nil {
			return err
		}
		xmin = uint64(x)
		if id.Valid {
			found = append(found, id.Int64)
		}
		return nil
	})
	return found, xmin, err
}
