// Package failover runs the scenario the failover tests and the benchmark
// program share: publishers commit at a steady rate over many keys
// through a multi-host URL (target_session_attrs=read-write) to a
// PostgreSQL primary with a synchronous standby, a forwarder (polling,
// change data capture, or change data capture with publishers without a
// table) moves the messages to an in-memory destination, the primary is
// killed with SIGKILL (or stopped cleanly, for a switchover) mid-stream,
// the standby is promoted, and publishing goes on. The forwarder is never
// restarted. Result counts what the application saw commit against what
// the destination received.
package failover

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// Mode is the forwarder's source and the publishers' kind.
type Mode string

// Modes of the scenario.
const (
	// Polling: publishers write the table, the forwarder polls it.
	Polling Mode = "polling"
	// CDC: publishers write the table, the forwarder streams its inserts.
	CDC Mode = "cdc"
	// WithoutTable: publishers write logical decoding messages
	// (forwarder.PublisherConfig.WithoutTable), the forwarder streams them.
	WithoutTable Mode = "without_table"
)

// Driver is how the forwarder and the publishers reach the database.
type Driver string

// Drivers of the scenario.
const (
	// Pgx: a pgxpool.Pool through pgxv5.WrapPool.
	Pgx Driver = "pgx"
	// StdSQL: database/sql with pgx's stdlib driver through stdsql.WrapDB.
	StdSQL Driver = "stdsql"
)

// Ending is how the primary goes away.
type Ending string

// Endings of the primary.
const (
	// Kill kills every process of the primary with SIGKILL.
	Kill Ending = "kill"
	// Switchover stops the primary cleanly and waits until the standby
	// has replayed all of it, as a planned switchover does.
	Switchover Ending = "switchover"
	// Fence makes the primary read-only (default_transaction_read_only,
	// reloaded) and leaves it running, as a failover manager fences an
	// old primary it cannot stop: sessions connected to it stay
	// connected, and every write of theirs fails with SQLSTATE 25006.
	Fence Ending = "fence"
)

// Scenario is one run. Zero fields take the defaults named.
type Scenario struct {
	// Pair is the primary and its standby. Required.
	Pair *testenv.PostgresPair
	// Mode defaults to Polling.
	Mode Mode
	// Driver defaults to Pgx.
	Driver Driver
	// Rate is the commits per second of all publishers together, one
	// message each. Defaults to 200.
	Rate int
	// Keys is the number of ordering keys, each written by one publisher
	// goroutine in seq order. Defaults to 50.
	Keys int
	// Writers is the number of publisher goroutines. Defaults to 10.
	Writers int
	// Before is how long publishers write before the primary goes away.
	// Defaults to 1s.
	Before time.Duration
	// Down is the time between the primary's end and the promotion.
	// Defaults to 1s.
	Down time.Duration
	// After is how long publishers write after the promotion. Defaults
	// to 1s.
	After time.Duration
	// Ending is how the primary goes away. Defaults to Kill.
	Ending Ending
	// Drain is how long to wait, once publishing ended, for every
	// committed message to arrive. Defaults to 30s.
	Drain time.Duration
	// DestinationDelay makes the destination take one call at a time,
	// each for this long, so that the forwarder lags behind the
	// publishers when the primary goes away. Defaults to 0: calls return
	// at once, in parallel.
	DestinationDelay time.Duration
	// Logger is the forwarder's logger. Defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
	// Errors, when set, receives every error the forwarder reports
	// (forwarder.Hooks.OnError).
	Errors func(error)
}

// WithDefaults returns s with its zero fields set to their defaults.
func (s Scenario) WithDefaults() Scenario {
	s.setDefaults()
	return s
}

func (s *Scenario) setDefaults() {
	s.Mode = cmp.Or(s.Mode, Polling)
	s.Driver = cmp.Or(s.Driver, Pgx)
	s.Ending = cmp.Or(s.Ending, Kill)
	s.Rate = cmp.Or(s.Rate, 200)
	s.Keys = cmp.Or(s.Keys, 50)
	s.Writers = min(cmp.Or(s.Writers, 10), s.Keys)
	s.Before = cmp.Or(s.Before, time.Second)
	s.Down = cmp.Or(s.Down, time.Second)
	s.After = cmp.Or(s.After, time.Second)
	s.Drain = cmp.Or(s.Drain, 30*time.Second)
	if s.Logger == nil {
		s.Logger = watermill.NopLogger{}
	}
}

// Result is what a run found.
type Result struct {
	// Committed counts the messages whose commit the application saw
	// succeed; CommittedBefore of them before the primary went away,
	// CommittedAfter after the promotion.
	Committed, CommittedBefore, CommittedAfter int
	// Backlog counts the messages committed before the primary went away
	// that had not arrived by then: what the forwarder had still to do.
	Backlog int
	// Unknown counts messages whose commit failed with the connection:
	// the application cannot know whether they committed. They may or
	// may not arrive.
	Unknown int
	// Lost lists committed messages that never arrived, "key/seq"; of
	// them LostBefore committed before the primary went away (messages
	// of publishers without a table that only the lost slot could read).
	Lost       []string
	LostBefore int
	// LostAfterDetail says when each lost message committed after the
	// primary went away began and committed, from the promotion.
	LostAfterDetail []string
	// Delivered counts the distinct messages that arrived, Duplicates
	// the deliveries beyond the first.
	Delivered, Duplicates int
	// Order lists per-key order violations among first deliveries.
	Order []string
	// Resume is the time from the promotion to the first delivery of a
	// message committed after it (one read from the new primary); -1 when
	// none came.
	Resume time.Duration
	// FirstCommit is the time from the promotion to the first commit
	// after it; -1 when none came.
	FirstCommit time.Duration
	// Stopped tells that the forwarder's Run returned during the run, with
	// its error: it should run throughout.
	Stopped error
	// DownReported tells that the forwarder's Status said, while the
	// database was away, since when it failed (DatabaseDownSince);
	// DownAtEnd is what it said once everything arrived (zero: it
	// answers again).
	DownReported bool
	DownAtEnd    time.Time
}

// LostAfter is the number of committed messages lost that committed
// after the primary went away.
func (r Result) LostAfter() int { return len(r.Lost) - r.LostBefore }

// written is a message the application tried to commit.
type written struct {
	key, seq  int
	begun     time.Time // when its transaction began
	at        time.Time // when the commit returned
	committed bool
	unknown   bool
	before    bool // committed before the primary went away
}

// Run runs the scenario once.
func Run(ctx context.Context, s Scenario) (Result, error) {
	s.setDefaults()
	if s.Pair == nil {
		return Result{}, errors.New("failover: Scenario.Pair is required")
	}
	url := s.Pair.URL()
	schema := testenv.UniqueName("fo_")
	fdb, closeF, err := open(ctx, s.Driver, url)
	if err != nil {
		return Result{}, err
	}
	defer closeF()
	// The publishers name the outbox through their search_path, the
	// forwarder by its schema: a publisher wakes a forwarder of its own
	// process that names the table as it does, and these, as publishers
	// of another process, leave the forwarder to find their commits in
	// the database.
	pdb, closeP, err := open(ctx, s.Driver, url+"&search_path="+schema)
	if err != nil {
		return Result{}, err
	}
	defer closeP()
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		return Result{}, err
	}
	pd, err := postgres.New(postgres.Options{})
	if err != nil {
		return Result{}, err
	}
	if err := sqladapters.Migrate(ctx, fdb, d); err != nil {
		return Result{}, fmt.Errorf("migrate: %w", err)
	}
	rec := newRecorder(s.DestinationDelay)
	cfg := forwarder.Config{DB: fdb, Dialect: d, Destination: rec, Logger: s.Logger}
	if s.Errors != nil {
		cfg.Hooks.OnError = s.Errors
	}
	if s.Mode != Polling {
		src := cdc.Source{ConnString: url, Slot: schema, Publication: schema, CreateIfMissing: true, StandbyRetry: 100 * time.Millisecond}
		cfg.Source = src
	} else {
		cfg.Source = forwarder.Polling{}
	}
	fw, err := forwarder.New(cfg)
	if err != nil {
		return Result{}, err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fw.Run(context.Background()) }()
	defer func() {
		_ = fw.Close()
		<-runErr
	}()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = fw.Ready(rctx)
	cancel()
	if err != nil {
		return Result{}, fmt.Errorf("forwarder: %w", err)
	}
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: pd, WithoutTable: s.Mode == WithoutTable, Slot: schema})
	if err != nil {
		return Result{}, err
	}

	var gone atomic.Bool // the primary went away
	wctx, stopWriters := context.WithCancel(ctx)
	defer stopWriters()
	var mu sync.Mutex
	var msgs []*written
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * float64(s.Writers) / float64(s.Rate))
	for w := range s.Writers {
		wg.Go(func() {
			tick := time.NewTicker(interval)
			defer tick.Stop()
			seqs := map[int]int{}
			k := w
			for {
				select {
				case <-wctx.Done():
					return
				case <-tick.C:
				}
				m := &written{key: k, seq: seqs[k]}
				m.begun = time.Now()
				err := publish(wctx, pdb, pub, m)
				switch {
				case err == nil:
					m.committed, m.at = true, time.Now()
					m.before = !gone.Load()
				case errors.Is(err, errCommit):
					m.unknown = true
				default:
					continue // rolled back: the same seq again
				}
				mu.Lock()
				msgs = append(msgs, m)
				mu.Unlock()
				seqs[k]++
				if k += s.Writers; k >= s.Keys {
					k = w
				}
			}
		})
	}

	sleep(ctx, s.Before)
	gone.Store(true)
	var downReported atomic.Bool
	sampling, stopSampling := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampling)
		for {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, _ := fw.Status(sctx)
			cancel()
			if !st.DatabaseDownSince.IsZero() {
				downReported.Store(true)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	ectx, cancel := context.WithTimeout(ctx, 60*time.Second)
	switch s.Ending {
	case Switchover:
		err = s.Pair.StopPrimary(ectx)
	case Fence:
		err = s.Pair.FencePrimary(ectx)
	default:
		err = s.Pair.KillPrimary()
	}
	cancel()
	if err != nil {
		return Result{}, err
	}
	ended := time.Now()
	s.Logger.Info("failover: the primary went away", watermill.LogFields{"ending": string(s.Ending)})
	sleep(ctx, s.Down)
	pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	err = s.Pair.Promote(pctx)
	cancel()
	if err != nil {
		return Result{}, err
	}
	promoted := time.Now()
	s.Logger.Info("failover: the standby was promoted", nil)
	sleep(ctx, s.After)
	stopWriters()
	wg.Wait()

	res := Result{Resume: -1, FirstCommit: -1}
	defer func() { close(stopSampling); <-sampling }()
	all, after := map[string]bool{}, map[string]bool{}
	for _, m := range msgs {
		if m.committed {
			all[uuidOf(m.key, m.seq)] = true
			if m.at.After(promoted) {
				after[uuidOf(m.key, m.seq)] = true
			}
		}
	}
	// Without a table, what the lost slot had not delivered never
	// arrives: once everything committed after the promotion has, the
	// wait ends when deliveries stop.
	deadline := time.Now().Add(s.Drain)
	for !rec.hasAll(all) && time.Now().Before(deadline) && ctx.Err() == nil {
		if s.Mode == WithoutTable && rec.hasAll(after) && time.Since(rec.lastAt()) > quiet {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.DownReported = downReported.Load()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	if st, err := fw.Status(sctx); err == nil {
		res.DownAtEnd = st.DatabaseDownSince
	}
	scancel()
	select {
	case res.Stopped = <-runErr:
		if res.Stopped == nil {
			res.Stopped = errors.New("Run returned nil")
		}
		runErr <- res.Stopped
	default:
	}
	got := rec.snapshot()
	arrived := map[string]time.Time{}
	for _, dl := range got {
		if _, ok := arrived[dl.uuid]; !ok {
			arrived[dl.uuid] = dl.at
		}
	}
	for _, m := range msgs {
		if at, ok := arrived[uuidOf(m.key, m.seq)]; m.committed && m.at.Before(ended) && (!ok || at.After(ended)) {
			res.Backlog++
		}
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, dl := range got {
		if after[dl.uuid] && res.Resume < 0 {
			res.Resume = dl.at.Sub(promoted)
		}
		if seen[dl.uuid] {
			res.Duplicates++
			continue
		}
		seen[dl.uuid] = true
		res.Delivered++
		if prev, ok := last[dl.key]; ok && dl.seq <= prev {
			res.Order = append(res.Order, fmt.Sprintf("key %s: seq %d arrived after %d", dl.key, dl.seq, prev))
		}
		last[dl.key] = max(dl.seq, last[dl.key])
	}
	for _, m := range msgs {
		if m.committed && !m.before && m.begun.Before(ended) {
			// Begun before the old primary was gone: it may have
			// committed there (a fenced primary takes a moment to reach
			// every session; a killed one runs until the signal lands),
			// however late this goroutine got to note the commit on a
			// busy machine. Only a transaction begun after can have
			// committed on the promoted standby alone.
			m.before = true
		}
		switch {
		case m.unknown:
			res.Unknown++
		case m.committed:
			res.Committed++
			if m.before {
				res.CommittedBefore++
			} else {
				res.CommittedAfter++
				if d := m.at.Sub(promoted); res.FirstCommit < 0 || d < res.FirstCommit {
					res.FirstCommit = d
				}
			}
			if !seen[uuidOf(m.key, m.seq)] {
				res.Lost = append(res.Lost, strconv.Itoa(m.key)+"/"+strconv.Itoa(m.seq))
				if m.before {
					res.LostBefore++
				} else {
					res.LostAfterDetail = append(res.LostAfterDetail, fmt.Sprintf("%d/%d begun %v and committed %v after the promotion",
						m.key, m.seq, m.begun.Sub(promoted).Round(time.Millisecond), m.at.Sub(promoted).Round(time.Millisecond)))
				}
			}
		}
	}
	sort.Strings(res.Lost)
	return res, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// quiet is how long deliveries must have stopped before a run without a
// table stops waiting for messages the lost slot took with it.
const quiet = 3 * time.Second

// uuidOf names message seq of key: a redelivery carries the same UUID.
func uuidOf(key, seq int) string { return "k" + strconv.Itoa(key) + "-" + strconv.Itoa(seq) }

// errCommit marks a failed commit: its outcome is unknown.
var errCommit = errors.New("commit failed")

// publish commits m in a transaction of its own.
func publish(ctx context.Context, db sqladapters.DB, pub *forwarder.Publisher, m *written) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return err
	}
	msg := message.NewMessage(uuidOf(m.key, m.seq), []byte("payload"))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(m.key))
	msg.Metadata.Set("seq", strconv.Itoa(m.seq))
	if err := pub.PublishTx(ctx, tx, "failover", msg); err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%w: %w", errCommit, err)
	}
	return nil
}

// open returns a DB on url through driver, and its close.
func open(ctx context.Context, driver Driver, url string) (sqladapters.DB, func(), error) {
	switch driver {
	case Pgx:
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, nil, err
		}
		cfg.MaxConns = 20
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, err
		}
		return pgxv5.WrapPool(pool), pool.Close, nil
	case StdSQL:
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, nil, err
		}
		db := stdlib.OpenDB(*cfg.ConnConfig)
		db.SetMaxOpenConns(20)
		return stdsql.WrapDB(db), func() { _ = db.Close() }, nil
	}
	return nil, nil, fmt.Errorf("failover: unknown driver %q", driver)
}

// delivery is one message the destination received.
type delivery struct {
	uuid, key string
	seq       int
	at        time.Time
}

// recorder is the in-memory destination: it records every delivery with
// its time.
type recorder struct {
	delay time.Duration
	slow  sync.Mutex // one call at a time, with delay
	mu    sync.Mutex
	got   []delivery
	seen  map[string]bool
}

func newRecorder(delay time.Duration) *recorder {
	return &recorder{delay: delay, seen: map[string]bool{}}
}

// Publish implements message.Publisher.
func (r *recorder) Publish(_ string, msgs ...*message.Message) error {
	if r.delay > 0 {
		r.slow.Lock()
		time.Sleep(r.delay)
		r.slow.Unlock()
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range msgs {
		seq, _ := strconv.Atoi(m.Metadata.Get("seq"))
		r.got = append(r.got, delivery{uuid: m.UUID, key: m.Metadata.Get(forwarder.DefaultKeyMetadataField), seq: seq, at: now})
		r.seen[m.UUID] = true
	}
	return nil
}

// Close implements message.Publisher.
func (r *recorder) Close() error { return nil }

func (r *recorder) hasAll(want map[string]bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for u := range want {
		if !r.seen[u] {
			return false
		}
	}
	return true
}

// lastAt is the time of the last delivery.
func (r *recorder) lastAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		return time.Time{}
	}
	return r.got[len(r.got)-1].at
}

func (r *recorder) snapshot() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}
