package cdc

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/forwarder/cdc/internal/pgoutput"
	"github.com/millbox/millbox/forwarder/cdc/internal/writer"
	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// streamer is the change-data-capture source. One instance at a time is
// the active reader of the slot: its lead loop holds a session (the
// replication connection and what the session knows of the stream); the
// others stand by. The session's state is the engine loop's.
type streamer struct {
	cfg  Source
	env  source.Env
	lg   sqladapters.Logical
	e    source.Engine
	feed chan func()
	oid  uint32 // the outbox table, as the stream names it
	// messages: the server streams logical decoding messages
	// (PostgreSQL 14 or later): those of publishers without a table.
	messages bool
	store    *writer.Writer // writes emitted rows into the tables, in order

	active    atomic.Bool
	confirmed atomic.Uint64 // the slot position the server is told
	oldest    atomic.Int64  // commit time (unix ns) of the oldest unconfirmed transaction, 0 if none

	sess *session // the loop's: the active session, nil while standing by
	// emits is the highest number of a call without a table the stream
	// has brought (the loop's).
	emits int64
	hist  serverMark // the lead loop's: the server of the last session
}

// Prepare implements source.Source: the server settings, the role, the
// table, the publication and the slot (created with CreateIfMissing).
func (s *streamer) Prepare(ctx context.Context) error {
	st, err := preflight(ctx, s.env, s.lg, s.cfg)
	s.oid, s.messages = st.TableOID, st.ServerVersion >= 140000
	return err
}

// Start implements source.Source. The forwarder runs from here on,
// whether this instance leads or stands by.
func (s *streamer) Start(ctx context.Context, e source.Engine) (wait func()) {
	s.e = e
	s.store = writer.New(e.Do, s.env.ReportError, s.env.Logger)
	unregister, err := s.registerGauges()
	if err != nil {
		s.env.Logger.Error("millbox cdc: cannot register the slot gauges", err, nil)
		unregister = func() {}
	}
	e.Started()
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx) })
	wg.Go(func() { s.store.Run(ctx) })
	return func() {
		s.store.Stop()
		wg.Wait()
		unregister()
	}
}

// maxRetry bounds the wait of the lead loop after a failure: a server
// that went away may come back, or a standby be promoted, at any moment,
// and each try costs one statement.
const maxRetry = time.Second

// repeatLogEvery is how often the same failure of the lead loop is
// logged again while it lasts: it is tried every second.
const repeatLogEvery = 10 * time.Second

// run leads when no other instance does, and stands by otherwise, until
// ctx ends.
func (s *streamer) run(ctx context.Context) {
	backoff := retry.Backoff{Policy: retry.Operations}
	var logged string // the failure last logged, and when
	var loggedAt time.Time
	for {
		var delay time.Duration
		err := s.lead(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.env.ReportError(err)
			s.env.Database(err)
			delay = min(backoff.Next(err), maxRetry)
			if msg := err.Error(); msg != logged || time.Since(loggedAt) >= repeatLogEvery {
				s.env.Logger.Error("millbox cdc: reader stopped; trying again", err, watermill.LogFields{"retry_in": delay.String()})
				logged, loggedAt = msg, time.Now()
			}
		} else {
			backoff.Reset()
			delay, logged = s.cfg.StandbyRetry, ""
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// lead takes the leadership and runs one session of the active reader,
// until ctx ends or the connection fails. It returns nil at once when
// another instance leads.
func (s *streamer) lead(ctx context.Context) error {
	// A standby does not open a replication connection (a walsender of
	// max_wal_senders) while the slot is streaming to another reader.
	st, ok, err := s.lg.Slot(ctx, s.env.DB, s.cfg.Slot)
	switch {
	case err != nil:
		return fmt.Errorf("millbox cdc: read slot: %w", err)
	case !ok:
		// Dropped, or the server is a standby promoted since the last
		// session: the new session reads the table's rows from the table.
		if err := s.recreate(ctx); err != nil {
			return err
		}
	case st.Active:
		return nil
	}
	conn, leader, err := connect(ctx, &s.cfg)
	if err != nil || !leader {
		return err
	}
	defer conn.Close(context.Background())
	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("millbox cdc: identify the server: %w", err)
	}
	s.env.Database(nil)
	s.setActive(true)
	defer s.setActive(false)
	s.env.Logger.Info("millbox cdc: active reader", watermill.LogFields{"slot": s.cfg.Slot})

	if s.env.ExactlyOnce {
		// Before the session reads the table: fence the previous reader's
		// transactions and remove the rows it published, so that they are
		// not pending any more.
		if _, err := s.e.Acquire(ctx, []int{0}); err != nil {
			return fmt.Errorf("millbox cdc: claim the outbox's transactions: %w", err)
		}
		defer s.e.Release([]int{0})
	}
	if st, _, err = s.lg.Slot(ctx, s.env.DB, s.cfg.Slot); err != nil {
		return fmt.Errorf("millbox cdc: read slot: %w", err)
	}
	s.noteServer(sys, st, !ok)
	s.confirmed.Store(st.Confirmed)
	start, keys, err := s.lg.PendingKeys(ctx, s.env.DB, s.env.DeadLetterHolds)
	if err != nil {
		return fmt.Errorf("millbox cdc: read pending keys: %w", err)
	}
	if err := startReplication(ctx, conn, &s.cfg, s.messages); err != nil {
		return err
	}
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	sess := newSession(s, sctx, scancel, start, pglogrepl.LSN(st.Confirmed), keys)
	if !s.e.Do(func() { s.sess = sess; sess.pollSoon(0) }) {
		return nil // the forwarder stopped
	}
	r := &reader{conn: conn, cfg: &s.cfg, dec: pgoutput.NewDecoder(s.oid, sqladapters.EmitPrefix+strconv.FormatUint(uint64(s.oid), 10)),
		s: s, sess: sess, confirmed: &s.confirmed, received: pglogrepl.LSN(st.Confirmed)}
	err = r.run(sctx)
	abort := sess.abortErr.Load()
	if abort != nil {
		// The server is going away: it waits for its replication clients
		// before it stops, so let go at once; the next session resumes
		// from the slot.
		_ = r.sendStatus()
		conn.Close(context.Background())
	}
	// Calls in flight finish and published rows are deleted; then the
	// server learns how far the rows are done. Rows given back meanwhile
	// are left to the next session.
	sess.ending.Store(true)
	end := func() error {
		sess.end()
		s.sess = nil
		return nil
	}
	if qerr := s.e.Quiesce(context.Background(), func() error { return s.sync(end) }); errors.Is(qerr, sqladapters.ErrClosed) {
		_ = end() // the engine has stopped: nothing else runs
	}
	switch {
	case abort != nil:
		return *abort
	case sess.lostErr.Load() != nil:
		return *sess.lostErr.Load()
	case ctx.Err() != nil:
		_ = r.sendStatus()
		return nil
	}
	return err
}

// sync runs fn on the engine's loop and waits for it.
func (s *streamer) sync(fn func() error) error {
	var err error
	done := make(chan struct{})
	if !s.e.Do(func() { err = fn(); close(done) }) {
		return fn()
	}
	<-done
	return err
}

func (s *streamer) setActive(v bool) {
	s.active.Store(v)
	if !v {
		s.oldest.Store(0)
	}
	if s.env.Active != nil {
		s.env.Active(v)
	}
}

// Partitions implements source.Source: the active reader holds the
// slot, which counts as the outbox's one partition.
func (s *streamer) Partitions() []int {
	if s.active.Load() {
		return []int{0}
	}
	return nil
}

// Lost implements source.Source: the session ends, and the next one
// acquires the outbox's transactions again before it reads the table.
func (s *streamer) Lost(int) {
	if x := s.sess; x != nil && x.lostErr.Load() == nil {
		err := errors.New("millbox cdc: a transaction's outcome is unknown or another reader fenced this one; starting a new session")
		x.lostErr.Store(&err)
		x.cancel()
	}
}

// Close implements source.Source: the session ended with the lead loop.
func (s *streamer) Close() {}

// Feed implements source.Source: the stream's transactions.
func (s *streamer) Feed() <-chan func() { return s.feed }

// Step implements source.Source.
func (s *streamer) Step() {
	if s.sess != nil {
		s.sess.maybePoll()
	}
}

// Busy implements source.Source.
func (s *streamer) Busy() bool { return s.sess != nil && (s.sess.reading || s.sess.writes > 0) }

// rows calls fn for each row of the current session among rows; rows of
// an earlier session are done with (their outcome is the engine's
// alone).
func (s *streamer) rows(rows []*source.Row, fn func(x *session, r *source.Row, t *rowTag)) {
	x := s.sess
	if x == nil {
		return
	}
	for _, r := range rows {
		if t, ok := r.Tag.(*rowTag); ok && t.sess == x {
			fn(x, r, t)
		}
	}
	x.advance()
}

// Delivered implements source.Source: an acknowledged row is done for
// the slot's position.
func (s *streamer) Delivered(rows []*source.Row) {
	s.rows(rows, func(x *session, _ *source.Row, t *rowTag) { x.rowDone(t) })
}

// Completed implements source.Source. A row the polling path read is
// done: the next read of its key is due, to publish what follows it or to
// give the key back to the stream.
func (s *streamer) Completed(rows []*source.Row) {
	s.rows(rows, func(x *session, r *source.Row, t *rowTag) {
		x.releaseLater(r)
		if t.tx == nil {
			x.pollSoon(0)
		}
	})
}

// Left implements source.Source: the row is in the table, its key handed
// to the polling path, which publishes it in id order once it is due.
func (s *streamer) Left(rows []*source.Row) {
	s.rows(rows, func(x *session, r *source.Row, t *rowTag) { x.left(r, t) })
}
