package forwarder

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/sqladapters"
)

// maxErrorLength bounds the last_error stored with a failed row.
const maxErrorLength = 2000

// Forwarder moves committed outbox rows to a destination publisher.
//
// Guarantees:
//   - at least once: a row leaves the outbox only after the destination's
//     Publish returned nil for it;
//   - per-key order: rows with the same ordering key are published one at
//     a time in outbox id order, also with many instances, because a key's
//     partition is leased by one instance at a time and a key that is
//     backing off after a failure holds its later rows back;
//   - a failing row is retried with exponential backoff and moved to the
//     dead letters after MaxAttempts; other keys keep flowing meanwhile.
//
// Each round publishes up to BatchSize due rows of the partitions this
// instance leases, up to Concurrency keys at a time (each key's rows in
// order, in calls of up to PublishBatch messages), records failures, and
// hands the published ids to a background deleter. A full round reads the
// next batch while it publishes.
type Forwarder struct {
	cfg      Config
	listener sqladapters.Listener
	channel  string

	mu      sync.Mutex
	started bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
	running chan struct{}
	runOnce sync.Once

	wakeCh  chan struct{}
	localCh <-chan struct{}

	// lease state, guarded by leaseMu
	leaseMu       sync.Mutex
	owned         []int
	leaseDeadline time.Time

	// batchMu is held by the main loop during a round, so partitions are
	// never released while rows of theirs are in flight. The fields below
	// it belong to the main loop.
	batchMu         sync.Mutex
	discardPrefetch bool            // set when partitions were released
	heldKeys        map[string]bool // keys with rows left pending in the last round

	// published rows whose delete is in flight; excluded from reads.
	ackMu      sync.Mutex
	ackPending map[int64]struct{}
	ackCh      chan []int64
	ackWG      sync.WaitGroup
}

// New validates cfg and returns a forwarder. It starts nothing: call Run.
func New(cfg Config) (*Forwarder, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Forwarder{
		cfg:        cfg,
		done:       make(chan struct{}),
		running:    make(chan struct{}),
		wakeCh:     make(chan struct{}, 1),
		ackPending: map[int64]struct{}{},
		ackCh:      make(chan []int64, 1),
	}
	if l, ok := cfg.DB.(sqladapters.Listener); ok && cfg.Dialect.NotifyChannel() != "" {
		f.listener, f.channel = l, cfg.Dialect.NotifyChannel()
	}
	return f, nil
}

// Running is closed once the forwarder holds its first leases and listens
// for notifications.
func (f *Forwarder) Running() <-chan struct{} { return f.running }

// Run forwards until ctx ends or Close is called. It returns an error when
// the forwarder cannot start (unreachable database, missing tables, a
// Partitions value other instances disagree with); later database or
// broker failures are logged and retried, never returned.
func (f *Forwarder) Run(ctx context.Context) error {
	f.mu.Lock()
	switch {
	case f.closed:
		f.mu.Unlock()
		return ErrClosed
	case f.started:
		f.mu.Unlock()
		return errors.New("millbox: forwarder is already running")
	}
	f.started = true
	ctx, cancel := context.WithCancel(ctx)
	f.cancel = cancel
	f.mu.Unlock()
	defer close(f.done)
	defer cancel()

	if err := f.setup(ctx); err != nil {
		return err
	}
	var local func()
	f.localCh, local = subscribeWake(f.cfg.Dialect.OutboxTable())
	defer local()

	var wg sync.WaitGroup
	listening := make(chan struct{})
	if f.listener != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.listenLoop(ctx, listening)
		}()
	} else {
		close(listening)
	}
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		f.ackLoop()
	}()
	leaseReady := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.leaseLoop(ctx, leaseReady)
	}()
	go func() {
		select {
		case <-leaseReady:
		case <-ctx.Done():
			return
		}
		select {
		case <-listening:
		case <-time.After(5 * time.Second): // polling covers a slow listener
		case <-ctx.Done():
			return
		}
		f.runOnce.Do(func() { close(f.running) })
	}()

	f.loop(ctx)

	// Shutdown: no round is in flight any more. Flush deletes, then give
	// the partitions back so other instances take over at once.
	close(f.ackCh)
	<-ackDone
	wg.Wait()
	f.leave()
	return nil
}

// Close stops Run gracefully: rows being published finish (or are left
// pending), published rows are deleted, and the partitions are released.
// It waits at most CloseTimeout.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	started, cancel := f.started, f.cancel
	f.mu.Unlock()
	if !started {
		return nil
	}
	cancel()
	select {
	case <-f.done:
		return nil
	case <-time.After(f.cfg.CloseTimeout):
		return fmt.Errorf("millbox: forwarder did not stop within CloseTimeout %v: a destination Publish call is blocking", f.cfg.CloseTimeout)
	}
}

func (f *Forwarder) setup(ctx context.Context) error {
	d := f.cfg.Dialect
	for _, q := range d.EnsurePartitions(f.cfg.Partitions) {
		if _, err := q.Exec(ctx, f.cfg.DB); err != nil {
			return fmt.Errorf("millbox: forwarder start: %w", d.ClassifyError(err))
		}
	}
	n, err := queryInt(ctx, f.cfg.DB, d.CountPartitions())
	if err != nil {
		return fmt.Errorf("millbox: forwarder start: %w", d.ClassifyError(err))
	}
	if n != f.cfg.Partitions {
		return fmt.Errorf("%w: Config.Partitions is %d but the outbox %s is split into %d partitions; "+
			"every forwarder of one outbox must use the same value (to change it, stop them all and delete the rows of the _leases table)",
			ErrInvalidConfig, f.cfg.Partitions, d.OutboxTable(), n)
	}
	return nil
}

func (f *Forwarder) signal() {
	select {
	case f.wakeCh <- struct{}{}:
	default:
	}
}

// fastPolls follow an in-process wakeup: the publisher pings before its
// transaction commits, so look again a few times shortly after.
var fastPolls = []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond}

func (f *Forwarder) loop(ctx context.Context) {
	errDelay := time.Duration(0)
	fast := len(fastPolls)
	var next *prefetch
	for ctx.Err() == nil {
		f.batchMu.Lock()
		if f.discardPrefetch {
			f.discardPrefetch = false
			next = next.drop()
		}
		var n int
		var more bool
		var err error
		if owned, ok := f.currentOwned(); ok {
			n, next, more, err = f.round(ctx, owned, next)
		} else {
			next = next.drop()
		}
		f.batchMu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			errDelay = min(max(2*errDelay, 100*time.Millisecond), 5*time.Second)
			f.cfg.Logger.Error("millbox forwarder: round failed; retrying", err, watermill.LogFields{"retry_in": errDelay.String()})
			sleep(ctx, errDelay)
			continue
		}
		errDelay = 0
		if more {
			continue
		}
		if n > 0 {
			fast = len(fastPolls)
		}
		wait := f.cfg.PollInterval
		if fast < len(fastPolls) {
			wait = fastPolls[fast]
			fast++
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-f.wakeCh:
		case <-f.localCh:
			fast = 0
		case <-timer.C:
		}
		timer.Stop()
	}
	next.drop()
}

// prefetch is the next batch, read while the current one is published.
type prefetch struct {
	done chan struct{}
	rows []sqladapters.OutboxRow
	err  error
}

// drop waits for the read to finish and forgets its rows: they were never
// published and stay pending.
func (p *prefetch) drop() *prefetch {
	if p != nil {
		<-p.done
	}
	return nil
}

func (f *Forwarder) startPrefetch(ctx context.Context, owned []int, inFlight []sqladapters.OutboxRow) *prefetch {
	p := &prefetch{done: make(chan struct{})}
	skip := make(map[int64]bool, len(inFlight))
	for _, r := range inFlight {
		skip[r.ID] = true
	}
	go func() {
		defer close(p.done)
		p.rows, p.err = f.read(ctx, owned, skip, true)
	}()
	return p
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// currentOwned returns the partitions to read; nil with ok means all.
func (f *Forwarder) currentOwned() ([]int, bool) {
	f.leaseMu.Lock()
	defer f.leaseMu.Unlock()
	if len(f.owned) == 0 || time.Now().After(f.leaseDeadline) {
		return nil, false
	}
	if len(f.owned) == f.cfg.Partitions {
		return nil, true
	}
	return f.owned, true
}

func (f *Forwarder) leaseValid() bool {
	f.leaseMu.Lock()
	defer f.leaseMu.Unlock()
	return time.Now().Before(f.leaseDeadline)
}

type failed struct {
	row sqladapters.OutboxRow
	err error
}

// round publishes one batch and records the outcome. The batch is the one
// prefetched during the previous round, or read now; when it is full, the
// next batch is read while this one is published. It returns the number of
// rows handled, the next prefetch, and whether more rows are likely due.
func (f *Forwarder) round(ctx context.Context, owned []int, pre *prefetch) (int, *prefetch, bool, error) {
	start := time.Now()
	var rows []sqladapters.OutboxRow
	var full bool
	if pre != nil {
		<-pre.done
		if pre.err != nil {
			return 0, nil, false, pre.err
		}
		// This batch was read before the previous round ended: keys that
		// left rows pending there (a failure, a lost lease) must not
		// overtake them.
		rows = pre.rows
		full = len(rows) >= f.cfg.BatchSize
		if len(f.heldKeys) > 0 {
			kept := rows[:0:0]
			for _, r := range rows {
				if r.Key == "" || !f.heldKeys[r.Key] {
					kept = append(kept, r)
				}
			}
			rows = kept
		}
	} else {
		var err error
		if rows, err = f.read(ctx, owned, nil, false); err != nil {
			return 0, nil, false, err
		}
		full = len(rows) >= f.cfg.BatchSize
	}
	f.heldKeys = nil
	if len(rows) == 0 {
		return 0, nil, full, nil
	}
	var next *prefetch
	if full {
		next = f.startPrefetch(ctx, owned, rows)
	}

	groups := groupByKey(rows)
	results := make([]groupResult, len(groups))
	var cursor atomic.Int64
	var wg sync.WaitGroup
	for range min(f.cfg.Concurrency, len(groups)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(cursor.Add(1) - 1)
				if i >= len(groups) {
					return
				}
				results[i] = f.publishGroup(ctx, groups[i])
			}
		}()
	}
	wg.Wait()

	stats := BatchStats{Read: len(rows)}
	var done []int64
	// The outcome is recorded even when ctx was cancelled meanwhile:
	// these rows were published.
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.CloseTimeout)
	defer cancel()
	for _, res := range results {
		done = append(done, res.done...)
		stats.Skipped += res.skipped
		if res.held != "" {
			if f.heldKeys == nil {
				f.heldKeys = map[string]bool{}
			}
			f.heldKeys[res.held] = true
		}
		if res.failed == nil {
			continue
		}
		dead, err := f.recordFailure(octx, *res.failed)
		if err != nil {
			f.cfg.Logger.Error("millbox forwarder: cannot record a failed attempt; the row will be tried again", err,
				watermill.LogFields{"id": res.failed.row.ID, "uuid": res.failed.row.UUID})
		}
		stats.Failed++
		if dead {
			stats.DeadLettered++
		}
	}
	stats.Forwarded = len(done)
	if len(done) > 0 {
		f.enqueueAck(done)
	}
	stats.Duration = time.Since(start)
	if f.cfg.Hooks.OnBatch != nil {
		f.cfg.Hooks.OnBatch(stats)
	}
	return stats.Read, next, full, nil
}

// groupByKey splits rows into the units published in parallel: all rows of
// one key, in id order, or a single row without a key.
func groupByKey(rows []sqladapters.OutboxRow) [][]sqladapters.OutboxRow {
	groups := make([][]sqladapters.OutboxRow, 0, len(rows))
	index := map[string]int{}
	for _, r := range rows {
		if r.Key == "" {
			groups = append(groups, []sqladapters.OutboxRow{r})
			continue
		}
		i, ok := index[r.Key]
		if !ok {
			i = len(groups)
			index[r.Key] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
	}
	return groups
}

// read returns up to BatchSize due rows, leaving out the rows in skip (the
// batch being published) and those whose delete is in flight. Those rows
// are still pending in the table: dialects that can exclude them in SQL do
// (MySQL, SQLite); on Postgres an exclusion list is scanned linearly per
// row under a prepared statement's generic plan, ten times slower than
// reading that many more rows and dropping them here.
//
// backlog tells that the previous batch was full, as it is for a
// prefetch. Only such reads apply a dialect's PendingReadSetup: a short
// read runs on its own and saves the transaction's round trips.
func (f *Forwarder) read(ctx context.Context, owned []int, skip map[int64]bool, backlog bool) ([]sqladapters.OutboxRow, error) {
	// ackMu is held until the rows are filtered: a delete that lands
	// meanwhile cannot drop its ids from ackPending while this read's
	// snapshot still shows the rows.
	f.ackMu.Lock()
	inFlight := func(id int64) bool {
		_, deleting := f.ackPending[id]
		return deleting || skip[id]
	}
	q := sqladapters.PendingQuery{Partitions: f.cfg.Partitions, Owned: owned, Limit: f.cfg.BatchSize}
	if f.cfg.Dialect.Features().ExcludeInSQL {
		q.Exclude = make([]int64, 0, len(skip)+len(f.ackPending))
		for id := range skip {
			q.Exclude = append(q.Exclude, id)
		}
		for id := range f.ackPending {
			q.Exclude = append(q.Exclude, id)
		}
	} else {
		q.Limit += len(skip) + len(f.ackPending)
	}
	var on sqladapters.Executor = f.cfg.DB
	if setup, ok := f.cfg.Dialect.(sqladapters.PendingReadSetup); ok && backlog {
		tx, err := f.readTx(ctx, setup.PendingReadSetup())
		if err != nil {
			f.ackMu.Unlock()
			return nil, fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))
		}
		defer sqladapters.Rollback(tx)
		on = tx
	}
	rows, err := f.cfg.Dialect.SelectPending(q).Query(ctx, on)
	if err != nil {
		f.ackMu.Unlock()
		return nil, fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))
	}
	defer f.ackMu.Unlock()
	defer rows.Close()
	out := make([]sqladapters.OutboxRow, 0, f.cfg.BatchSize)
	for rows.Next() && len(out) < f.cfg.BatchSize {
		var r sqladapters.OutboxRow
		var key sql.NullString
		if err := rows.Scan(&r.ID, &r.Topic, &r.UUID, &r.Payload, &r.Metadata, &key, &r.Attempts); err != nil {
			return nil, fmt.Errorf("millbox: read outbox row: %w", err)
		}
		if inFlight(r.ID) {
			continue
		}
		r.Key = key.String
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("millbox: read outbox: %w", f.cfg.Dialect.ClassifyError(err))
	}
	return out, nil
}

// readTx begins the read-only transaction a dialect's pending read runs
// in and applies its settings.
func (f *Forwarder) readTx(ctx context.Context, setup []sqladapters.Query) (sqladapters.Tx, error) {
	tx, err := f.cfg.DB.Begin(ctx, sql.TxOptions{ReadOnly: true})
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

type groupResult struct {
	done    []int64
	failed  *failed
	skipped int
	held    string // the key, when rows of it were left pending
}

// publishGroup publishes the rows of one key in order. Consecutive rows
// bound for one topic go to the destination in one Publish call of up to
// PublishBatch messages (a batching publisher sends them in one round
// trip). When such a call fails, its rows are tried one by one, so the
// failure is recorded on the row that caused it. After a failure the rest
// of the group stays pending: it waits for the failed row's retry.
func (f *Forwarder) publishGroup(ctx context.Context, rows []sqladapters.OutboxRow) groupResult {
	var res groupResult
	stop := func(i int, fl *failed) groupResult {
		res.failed = fl
		res.skipped += len(rows) - i
		if fl != nil {
			res.skipped--
		}
		res.held = rows[i].Key
		return res
	}
	msgs := make([]outgoing, len(rows))
	for i, r := range rows {
		msgs[i] = f.prepare(r)
	}
	for i := 0; i < len(rows); {
		// Once stopping or out of lease, leave the rest for later (or
		// for the next owner).
		if ctx.Err() != nil || !f.leaseValid() {
			return stop(i, nil)
		}
		if msgs[i].err != nil {
			return stop(i, &failed{row: rows[i], err: msgs[i].err})
		}
		j := i + 1
		for j < len(rows) && j-i < f.cfg.PublishBatch && msgs[j].err == nil && msgs[j].topic == msgs[i].topic {
			j++
		}
		if err := f.publish(msgs[i:j]); err != nil {
			if j-i == 1 {
				return stop(i, &failed{row: rows[i], err: err})
			}
			for k := i; k < j; k++ {
				if err := f.publish(msgs[k : k+1]); err != nil {
					return stop(k, &failed{row: rows[k], err: err})
				}
				res.done = append(res.done, rows[k].ID)
			}
			i = j
			continue
		}
		for k := i; k < j; k++ {
			res.done = append(res.done, rows[k].ID)
		}
		i = j
	}
	return res
}

// permanentError marks a row that can never be published as stored; it is
// dead-lettered at once.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// outgoing is a row turned into the message the destination receives.
type outgoing struct {
	topic string
	msg   *message.Message
	err   error
}

func (f *Forwarder) prepare(r sqladapters.OutboxRow) (o outgoing) {
	o.msg = message.NewMessage(r.UUID, r.Payload)
	if len(r.Metadata) > 0 {
		if err := json.Unmarshal(r.Metadata, &o.msg.Metadata); err != nil {
			o.err = permanentError{fmt.Errorf("malformed metadata %.100q: %w", r.Metadata, err)}
			return o
		}
	}
	o.topic = r.Topic
	if f.cfg.Topic != nil {
		defer func() {
			if p := recover(); p != nil {
				o.err = fmt.Errorf("topic mapping panicked: %v", p)
			}
		}()
		topic, err := f.cfg.Topic(r.Topic, o.msg)
		switch {
		case err != nil:
			o.err = fmt.Errorf("topic mapping: %w", err)
		case topic == "":
			o.err = fmt.Errorf("topic mapping returned an empty topic for %q", r.Topic)
		}
		o.topic = topic
	}
	return o
}

// publish hands messages bound for one topic to the destination.
func (f *Forwarder) publish(out []outgoing) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("destination publisher panicked: %v", p)
		}
	}()
	msgs := make([]*message.Message, len(out))
	for i, o := range out {
		msgs[i] = o.msg
	}
	return f.cfg.Publisher.Publish(out[0].topic, msgs...)
}

func (f *Forwarder) recordFailure(ctx context.Context, fl failed) (dead bool, err error) {
	attempts := fl.row.Attempts + 1
	var perm permanentError
	dead = errors.As(fl.err, &perm) || (f.cfg.MaxAttempts > 0 && attempts >= f.cfg.MaxAttempts)
	fail := sqladapters.Failure{
		ID:       fl.row.ID,
		Attempts: attempts,
		Error:    cleanError(fl.err),
		Backoff:  f.backoff(attempts),
		Dead:     dead,
	}
	fields := watermill.LogFields{"id": fl.row.ID, "uuid": fl.row.UUID, "topic": fl.row.Topic, "attempts": attempts}
	if dead {
		f.cfg.Logger.Error("millbox forwarder: row moved to the dead letters", fl.err, fields)
	} else {
		fields["retry_in"] = fail.Backoff.String()
		f.cfg.Logger.Info("millbox forwarder: publish failed; will retry: "+fail.Error, fields)
	}
	if f.cfg.Hooks.OnFailure != nil {
		f.cfg.Hooks.OnFailure(fail, fl.row)
	}
	_, err = f.cfg.Dialect.RecordFailure(fail).Exec(ctx, f.cfg.DB)
	return dead, f.cfg.Dialect.ClassifyError(err)
}

// backoff is MinBackoff doubled per attempt, capped at MaxBackoff, ± jitter.
func (f *Forwarder) backoff(attempts int) time.Duration {
	d := f.cfg.MinBackoff
	for i := 1; i < attempts && d < f.cfg.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, f.cfg.MaxBackoff)
	if j := f.cfg.BackoffJitter; j > 0 && d > 0 {
		d = time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
	}
	return d
}

// cleanError makes an error storable as text in every database: valid
// UTF-8, no NUL bytes, bounded length.
func cleanError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > maxErrorLength {
		s = s[:maxErrorLength]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

func queryInt(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (int, error) {
	rows, err := q.Query(ctx, e)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	var n int
	if rows.Next() {
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
	}
	return n, rows.Err()
}
