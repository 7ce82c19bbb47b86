package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
)

// Forwarder streams the outbox table's inserts from a logical replication
// slot to a destination publisher. See the package documentation for what
// it guarantees.
type Forwarder struct {
	cfg   Config
	names names

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	running chan struct{}
	runOnce sync.Once
	runErr  error // set before done is closed

	active    atomic.Bool
	confirmed atomic.Uint64 // the slot position the server is told
	oldest    atomic.Int64  // commit time (unix ns) of the oldest unconfirmed transaction, 0 if none
}

// New validates cfg and returns a forwarder. It starts nothing: call Run.
func New(cfg Config) (*Forwarder, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	n, err := outboxNames(cfg.Dialect)
	if err != nil {
		return nil, err
	}
	return &Forwarder{cfg: cfg, names: n, done: make(chan struct{}), running: make(chan struct{})}, nil
}

// Running is closed once Run has checked the database and runs (as the
// active reader or as a standby), or once Run returned.
func (f *Forwarder) Running() <-chan struct{} { return f.running }

// Ready waits until the forwarder runs and returns nil, or returns why it
// will not: the error Run returned (wal_level, REPLICATION, missing table,
// publication or slot), ErrClosed, or ctx's error.
func (f *Forwarder) Ready(ctx context.Context) error {
	select {
	case <-f.running:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f.done:
		if f.runErr != nil {
			return f.runErr
		}
		return ErrClosed
	default:
		return nil
	}
}

// Active tells whether this instance is the active reader now.
func (f *Forwarder) Active() bool { return f.active.Load() }

func (f *Forwarder) markRunning() { f.runOnce.Do(func() { close(f.running) }) }

// Run forwards until ctx ends or Close is called: it becomes the active
// reader when no other instance is, and stands by otherwise. It returns an
// error when it cannot start (see Ready); later failures (a lost
// connection, a restarted database) are logged and retried.
func (f *Forwarder) Run(ctx context.Context) (err error) {
	f.mu.Lock()
	switch {
	case f.closed:
		f.mu.Unlock()
		return ErrClosed
	case f.started:
		f.mu.Unlock()
		return errors.New("millbox cdc: forwarder is already running")
	}
	f.started = true
	ctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.mu.Unlock()
	defer func() {
		cancel()
		f.runErr = err
		f.markRunning()
		close(f.done)
	}()
	if err := preflight(ctx, f.cfg, f.names); err != nil {
		return err
	}
	unregister, err := f.registerGauges()
	if err != nil {
		return fmt.Errorf("millbox cdc: gauges: %w", err)
	}
	defer unregister()
	f.markRunning()
	var delay time.Duration
	for {
		err := f.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			f.reportError(err)
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			f.cfg.Logger.Error("millbox cdc: reader stopped; trying again", err, watermill.LogFields{"retry_in": delay.String()})
		} else {
			delay = f.cfg.StandbyRetry
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Close stops Run, waiting up to CloseTimeout for the calls in flight and
// the deletes of published rows; the slot is then confirmed up to them.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	f.closed = true
	cancel, started := f.cancel, f.started
	f.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	t := time.NewTimer(f.cfg.CloseTimeout + 5*time.Second)
	defer t.Stop()
	select {
	case <-f.done:
		return nil
	case <-t.C:
		return errors.New("millbox cdc: Close timed out")
	}
}

// lead takes the leadership and runs one session of the active reader,
// until ctx ends or the connection fails. It returns nil at once when
// another instance leads.
func (f *Forwarder) lead(ctx context.Context) error {
	// A standby does not open a replication connection (a walsender of
	// max_wal_senders) while the slot is streaming to another reader.
	if busy, err := queryBool(ctx, f.cfg.DB, `SELECT coalesce((SELECT active FROM pg_replication_slots WHERE slot_name = $1), false)`, f.cfg.Slot); err != nil || busy {
		return err
	}
	conn, leader, err := connect(ctx, &f.cfg)
	if err != nil || !leader {
		return err
	}
	defer conn.Close(context.Background())
	f.setActive(true)
	defer f.setActive(false)
	f.cfg.Logger.Info("millbox cdc: active reader", watermill.LogFields{"slot": f.cfg.Slot})

	confirmed, err := f.slotPosition(ctx)
	if err != nil {
		return err
	}
	f.confirmed.Store(uint64(confirmed))
	start, keys, err := f.pendingKeys(ctx)
	if err != nil {
		return err
	}
	if err := startReplication(ctx, conn, &f.cfg); err != nil {
		return err
	}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	events := make(chan streamEvent, 256)
	r := &reader{conn: conn, cfg: &f.cfg, table: f.names, out: events, confirmed: &f.confirmed, received: confirmed}
	rerr := make(chan error, 1)
	go func() {
		err := r.run(sctx)
		close(events)
		rerr <- err
	}()
	d := newDispatcher(f, sctx, scancel, events, start, confirmed, keys)
	d.loop()
	scancel()
	err = <-rerr
	if d.abortErr != nil {
		return d.abortErr
	}
	if ctx.Err() != nil {
		// Graceful stop: tell the server how far the rows are done.
		_ = r.sendStatus()
		return nil
	}
	return err
}

func (f *Forwarder) setActive(v bool) {
	f.active.Store(v)
	if !v {
		f.oldest.Store(0)
	}
	if f.cfg.Hooks.OnActive != nil {
		f.cfg.Hooks.OnActive(v)
	}
}

// slotPosition reads the slot's confirmed position.
func (f *Forwarder) slotPosition(ctx context.Context) (pglogrepl.LSN, error) {
	rows, err := f.cfg.DB.Query(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.cfg.Slot)
	if err != nil {
		return 0, fmt.Errorf("millbox cdc: read slot: %w", err)
	}
	defer rows.Close()
	var s sql.NullString
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: slot %s does not exist", ErrNotSetUp, f.cfg.Slot)
	}
	if err := rows.Scan(&s); err != nil {
		return 0, err
	}
	if !s.Valid {
		return 0, fmt.Errorf("millbox cdc: slot %s is not a logical slot", f.cfg.Slot)
	}
	return pglogrepl.ParseLSN(s.String)
}

// markColumns select the position and the oldest running transaction of
// a read's snapshot.
const markColumns = `SELECT pg_current_wal_flush_lsn()::text AS lsn, pg_snapshot_xmin(pg_current_snapshot())::text AS xmin`

func parseMark(lsn, xmin string) (snapshotMark, error) {
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return snapshotMark{}, err
	}
	x, err := strconv.ParseUint(xmin, 10, 64)
	if err != nil {
		return snapshotMark{}, err
	}
	return snapshotMark{lsn: l, xmin: uint32(x)}, nil
}

// pendingKeys reads the keys that have pending rows: they start handed to
// polling (a backlog, rows left by a previous reader).
func (f *Forwarder) pendingKeys(ctx context.Context) (snapshotMark, []lookupResult, error) {
	q := `WITH s AS (` + markColumns + `)
SELECT s.lsn, s.xmin, k.keyed, k.key FROM s LEFT JOIN (
	SELECT DISTINCT key IS NOT NULL AS keyed, coalesce(key, '') AS key FROM ` + f.cfg.Dialect.OutboxTable() + `
	WHERE dead_at IS NULL AND published_at IS NULL) k ON true`
	rows, err := f.cfg.DB.Query(ctx, q)
	if err != nil {
		return snapshotMark{}, nil, fmt.Errorf("millbox cdc: read pending keys: %w", f.cfg.Dialect.ClassifyError(err))
	}
	defer rows.Close()
	var mark snapshotMark
	var keys []lookupResult
	for rows.Next() {
		var lsn, xmin string
		var keyed sql.NullBool
		var key sql.NullString
		if err := rows.Scan(&lsn, &xmin, &keyed, &key); err != nil {
			return mark, nil, err
		}
		if mark, err = parseMark(lsn, xmin); err != nil {
			return mark, nil, err
		}
		if keyed.Valid {
			keys = append(keys, lookupResult{key: key.String, keyed: keyed.Bool})
		}
	}
	return mark, keys, rows.Err()
}

// poll reads the pending rows of the handed keys in id order, those
// waiting for a retry included (due tells), with the read's mark.
func (f *Forwarder) poll(ctx context.Context, keys []string, withUnkeyed bool, limit int) (res pollResult) {
	q := `WITH s AS (` + markColumns + `)
SELECT s.lsn, s.xmin, o.id, o.topic, o.uuid, o.payload, o.metadata::text, o.key, o.attempts, o.due, o.wait
FROM s LEFT JOIN LATERAL (
	SELECT id, topic, uuid, payload, metadata, key, attempts, next_attempt_at <= now() AS due,
		greatest(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait
	FROM ` + f.cfg.Dialect.OutboxTable() + `
	WHERE dead_at IS NULL AND published_at IS NULL AND (key = ANY($1::text[]) OR ($2::boolean AND key IS NULL))
	ORDER BY id LIMIT ` + strconv.Itoa(limit) + `) o ON true`
	rows, err := f.cfg.DB.Query(ctx, q, textArray(keys), withUnkeyed)
	if err != nil {
		res.err = fmt.Errorf("millbox cdc: read handed keys: %w", f.cfg.Dialect.ClassifyError(err))
		return res
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var lsn, xmin string
		var id sql.NullInt64
		var topic, uuid, md, key sql.NullString
		var payload []byte
		var attempts sql.NullInt64
		var due sql.NullBool
		var wait sql.NullFloat64
		if err := rows.Scan(&lsn, &xmin, &id, &topic, &uuid, &payload, &md, &key, &attempts, &due, &wait); err != nil {
			res.err = err
			return res
		}
		if res.mark, err = parseMark(lsn, xmin); err != nil {
			res.err = err
			return res
		}
		if !id.Valid {
			continue
		}
		n++
		r := &streamRow{keyed: key.Valid}
		r.ID, r.Topic, r.UUID, r.Payload, r.Metadata = id.Int64, topic.String, uuid.String, payload, []byte(md.String)
		r.Key, r.Attempts = key.String, int(attempts.Int64)
		res.rows = append(res.rows, polledRow{streamRow: r, due: due.Bool, wait: time.Duration(wait.Float64 * float64(time.Second))})
	}
	res.err = rows.Err()
	res.full = n >= limit
	return res
}

// keyOf reads the key of row id, with the read's mark.
func (f *Forwarder) keyOf(ctx context.Context, id int64) (lookupResult, snapshotMark, error) {
	q := `WITH s AS (` + markColumns + `)
SELECT s.lsn, s.xmin, o.id IS NOT NULL, o.key FROM s LEFT JOIN ` + f.cfg.Dialect.OutboxTable() + ` o ON o.id = $1
	AND o.dead_at IS NULL AND o.published_at IS NULL`
	rows, err := f.cfg.DB.Query(ctx, q, id)
	if err != nil {
		return lookupResult{}, snapshotMark{}, err
	}
	defer rows.Close()
	var r lookupResult
	var mark snapshotMark
	for rows.Next() {
		var lsn, xmin string
		var key sql.NullString
		if err := rows.Scan(&lsn, &xmin, &r.found, &key); err != nil {
			return r, mark, err
		}
		if mark, err = parseMark(lsn, xmin); err != nil {
			return r, mark, err
		}
		r.key, r.keyed = key.String, key.Valid
	}
	return r, mark, rows.Err()
}

// textArray renders keys as a text[] literal, every element quoted.
func textArray(keys []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, c := range []byte(k) {
			if c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(c)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
