package fleet

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/forwarder/polling"
	"github.com/millbox/millbox/forwarder/telemetry"
	"github.com/millbox/millbox/sqladapters"
)

// A tenant is idle (no forwarder, no connection), starting (a look or its
// forwarder's start under way), hot (its forwarder runs) or stopping (its
// forwarder finishes and hands over). A ring while it starts or stops
// marks it dirty: it looks again once that ended.
type tenantState int

const (
	idle tenantState = iota
	starting
	hot
	stopping
)

func (s tenantState) String() string {
	return [...]string{"idle", "starting", "hot", "stopping"}[s]
}

// tenant is one tenant this instance holds. Its fields above mu are the
// loop's; those below are shared with its forwarder's hooks and Status.
type tenant struct {
	spec     Tenant
	srv      *server
	dialect  sqladapters.Dialect
	state    tenantState
	dirty    bool // rung while starting or stopping
	released bool // no longer this instance's: stop, and do not start again
	waiting  []chan struct{}
	look     *time.Timer // the next look: sweep, a due time, a retry after a failure
	retry    retry.Backoff
	migrated bool
	attr     string // millbox.tenant, when named in metrics
	h        *handle
	fwd      *forwarder.Forwarder
	wake     chan struct{}
	hold     *time.Timer

	lastRows atomic.Int64 // unix ns of the last read that found rows

	mu        sync.Mutex
	gap       time.Duration // smoothed time between reads that found rows
	lastErr   string
	lastErrAt time.Time
	down      bool // the last start failed
	stats     sqladapters.OutboxStats
	lookedAt  time.Time
}

// own makes owned the tenants this instance holds: new ones are looked
// at, gone ones let go.
func (f *Fleet) own(owned []sqladapters.FleetTenant) {
	keep := make(map[string]bool, len(owned))
	for i, row := range owned {
		keep[row.ID] = true
		spec := Tenant{ID: row.ID, Server: row.Server, Database: row.Database, Schema: row.Schema}
		if t := f.tenants[row.ID]; t != nil {
			if t.spec == spec || t.state != idle {
				continue // a changed tenant changes once idle
			}
			f.forget(t)
		}
		t, err := f.newTenant(spec)
		if err != nil {
			f.cfg.Logger.Error("millbox fleet: a tenant of the catalog cannot be served", err, watermill.LogFields{"tenant": row.ID})
			continue
		}
		f.tenants[row.ID] = t
		// New tenants are looked at soon, spread over a second, so that
		// a start with many does not connect to all at once.
		f.schedule(t, time.Duration(i%100)*10*time.Millisecond)
	}
	for id := range f.tenants {
		if !keep[id] {
			f.release([]string{id}, nil)
		}
	}
	f.refresh()
}

func (f *Fleet) newTenant(spec Tenant) (*tenant, error) {
	if err := f.cfg.ValidateTenant(spec); err != nil {
		return nil, err
	}
	srv := f.servers[spec.Server]
	d, err := srv.s.Dialect(spec)
	if err != nil {
		return nil, err
	}
	t := &tenant{spec: spec, srv: srv, dialect: d, retry: retry.Backoff{Policy: tenantRetry}}
	if f.cfg.TenantAttribute {
		t.attr = "other"
		if f.named < f.cfg.TenantAttrLimit {
			f.named++
			t.attr = spec.ID
		}
	}
	return t, nil
}

// tenantRetry paces the looks at a tenant whose database failed.
var tenantRetry = retry.Exponential{Min: time.Second, Max: time.Minute, Jitter: 0.2}

// release stops the tenants (their forwarders finish and hand over) and
// forgets them; done, if not nil, is closed once all have stopped.
func (f *Fleet) release(ids []string, done chan struct{}) {
	var wait []*tenant
	for _, id := range ids {
		t := f.tenants[id]
		if t == nil {
			continue
		}
		t.released = true
		f.drop(t)
		if t.state != idle {
			wait = append(wait, t)
		} else {
			f.forget(t)
		}
	}
	if done == nil {
		return
	}
	if len(wait) == 0 {
		close(done)
		return
	}
	var left atomic.Int32
	left.Store(int32(len(wait)))
	for _, t := range wait {
		c := make(chan struct{})
		t.waiting = append(t.waiting, c)
		go func() {
			<-c
			if left.Add(-1) == 0 {
				close(done)
			}
		}()
	}
}

// drop stops t's forwarder, if it runs, and its timers.
func (f *Fleet) drop(t *tenant) {
	if t.look != nil {
		t.look.Stop()
	}
	if t.state == hot {
		f.stop(t)
	}
}

// forget removes an idle tenant.
func (f *Fleet) forget(t *tenant) {
	if f.tenants[t.spec.ID] == t {
		delete(f.tenants, t.spec.ID)
	}
	for _, c := range t.waiting {
		close(c)
	}
	t.waiting = nil
	f.refresh()
}

// schedule plans a look at t after wait, replacing the one planned.
func (f *Fleet) schedule(t *tenant, wait time.Duration) {
	if t.look != nil {
		t.look.Stop()
	}
	t.look = time.AfterFunc(wait, func() {
		f.do(func() {
			if f.tenants[t.spec.ID] == t && t.state == idle && f.mayStart(t) {
				f.start(t, false)
			}
		})
	})
}

// sweepLater plans t's next look: at the sweep, spread ± 25%, or at the
// due time of its earliest scheduled message.
func (f *Fleet) sweepLater(t *tenant, next time.Time) {
	sweep := f.cfg.SweepInterval
	wait := sweep*3/4 + time.Duration(rand.Int64N(int64(sweep/2)+1))
	if !next.IsZero() {
		wait = min(wait, max(time.Until(next), 0))
	}
	f.schedule(t, wait)
}

// onRing handles a ring of t's doorbell.
func (f *Fleet) onRing(t *tenant) {
	switch t.state {
	case idle:
		if f.mayStart(t) {
			f.start(t, true)
		}
	case hot:
		select {
		case t.wake <- struct{}{}:
		default:
		}
		t.lastRows.Store(time.Now().UnixNano()) // hold on: rows are coming
	default:
		t.dirty = true
	}
}

// mayStart tells whether t may start: still this instance's, and the
// fleet not closing.
func (f *Fleet) mayStart(t *tenant) bool { return !t.released && !f.closing }

// start looks at t (direct: a ring says rows came, so its forwarder
// starts at once without a look first).
func (f *Fleet) start(t *tenant, direct bool) {
	if t.look != nil {
		t.look.Stop()
	}
	t.state, t.dirty = starting, false
	if t.h == nil {
		t.h = t.srv.acquire(f, t.spec)
	}
	h := t.h
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stats, fwd, err := f.activate(ctx, t, h, direct)
		f.do(func() { f.onStarted(t, stats, fwd, err) })
	}()
}

// activate opens t's database, migrates it when so configured, looks at
// its outbox unless direct, and starts its forwarder when the look found
// rows to send. It runs on a goroutine of its own.
func (f *Fleet) activate(ctx context.Context, t *tenant, h *handle, direct bool) (sqladapters.OutboxStats, *forwarder.Forwarder, error) {
	db, err := h.db(ctx)
	if err != nil {
		return sqladapters.OutboxStats{}, nil, err
	}
	if f.cfg.MigrateTenants && !t.migrated {
		if err := sqladapters.Migrate(ctx, db, t.dialect); err != nil {
			return sqladapters.OutboxStats{}, nil, fmt.Errorf("migrate: %w", err)
		}
		t.migrated = true
	}
	var stats sqladapters.OutboxStats
	if !direct {
		if stats, err = t.dialect.OutboxStats(ctx, db); err != nil {
			return stats, nil, err
		}
		t.mu.Lock()
		t.stats, t.lookedAt = stats, time.Now()
		t.mu.Unlock()
		if stats.Pending == 0 && (stats.NextDue.IsZero() || stats.NextDue.After(time.Now())) {
			return stats, nil, nil // nothing to send: stay idle
		}
	}
	fwd, err := forwarder.New(f.tenantConfig(t, db))
	if err != nil {
		return stats, nil, err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(context.Background()) }()
	if err := fwd.Ready(ctx); err != nil {
		_ = fwd.Close()
		<-runErr
		return stats, nil, err
	}
	go func() {
		if err := <-runErr; err != nil {
			f.cfg.Logger.Error("millbox fleet: a tenant's forwarder stopped", err, watermill.LogFields{"tenant": t.spec.ID})
		}
	}()
	return stats, fwd, nil
}

// onStarted takes the outcome of a start.
func (f *Fleet) onStarted(t *tenant, stats sqladapters.OutboxStats, fwd *forwarder.Forwarder, err error) {
	switch {
	case err != nil:
		t.state = idle
		wait := t.retry.Next(err)
		t.mu.Lock()
		t.lastErr, t.lastErrAt, t.down = err.Error(), time.Now(), true
		t.mu.Unlock()
		f.logger(t.spec).Error("millbox fleet: cannot serve a tenant; trying again later", err,
			watermill.LogFields{"retry_in": wait.String(), "hint": hint(err)})
		f.idle(t, time.Time{})
		if f.mayStart(t) {
			f.schedule(t, wait)
		}
	case fwd == nil:
		t.retry.Reset()
		t.mu.Lock()
		t.down = false
		t.mu.Unlock()
		t.state = idle
		f.idle(t, stats.NextDue)
	default:
		t.retry.Reset()
		t.mu.Lock()
		t.down = false
		t.mu.Unlock()
		t.state, t.fwd = hot, fwd
		t.lastRows.Store(time.Now().UnixNano())
		if !f.mayStart(t) {
			f.stop(t)
			return
		}
		f.watchHold(t)
		return
	}
	if t.dirty && f.mayStart(t) {
		f.start(t, true)
	}
}

// hint says what to do about a tenant's failure, where millbox knows.
func hint(err error) string {
	if errors.Is(err, sqladapters.ErrMissingTable) {
		return "migrate the tenant (fleet.Config.MigrateTenants, or millbox migrate over the tenant list)"
	}
	return ""
}

// idle lets go of t's connections and plans its next look.
func (f *Fleet) idle(t *tenant, next time.Time) {
	if t.h != nil {
		t.srv.releaseHandle(t.h)
		t.h = nil
	}
	if t.released {
		f.forget(t)
		return
	}
	if !t.dirty && !f.closing {
		f.sweepLater(t, next)
	}
}

// tenantConfig is t's forwarder: the template's settings on t's database,
// its outbox held by this instance's lease, woken by the doorbell.
func (f *Fleet) tenantConfig(t *tenant, db sqladapters.DB) forwarder.Config {
	cfg := f.cfg.Forwarder
	cfg.DB, cfg.Dialect, cfg.Destination = db, t.dialect, f.cfg.Destination
	cfg.Source = tenantSource{
		poll: polling.Source{Partitions: f.cfg.Partitions, InstanceID: f.cfg.InstanceID, LeaseTTL: f.cfg.LeaseTTL},
		owner: func() time.Time {
			if t.released {
				return time.Time{}
			}
			return f.valid()
		},
	}
	t.wake = make(chan struct{}, 1)
	cfg.Wake = t.wake
	// Delayed messages: the mover looks at the due times it learns and
	// when the doorbell rings; the sweep bounds the rest.
	cfg.DelayedPollInterval = f.cfg.SweepInterval
	cfg.Logger = f.logger(t.spec)
	if t.attr != "" {
		cfg.Telemetry.Attributes = append(slices.Clip(cfg.Telemetry.Attributes), telemetry.AttrTenant.String(t.attr))
	}
	hooks := cfg.Hooks
	cfg.Hooks.OnRead = func(n int) {
		if n > 0 {
			f.rowsRead(t)
		}
		if hooks.OnRead != nil {
			hooks.OnRead(n)
		}
	}
	cfg.Hooks.OnError = func(err error) {
		t.mu.Lock()
		t.lastErr, t.lastErrAt = err.Error(), time.Now()
		t.mu.Unlock()
		if hooks.OnError != nil {
			hooks.OnError(err)
		}
	}
	return cfg
}

// rowsRead notes a read that found rows, for the hold time.
func (f *Fleet) rowsRead(t *tenant) {
	now := time.Now()
	prev := time.Unix(0, t.lastRows.Swap(now.UnixNano()))
	gap := now.Sub(prev)
	t.mu.Lock()
	if t.gap == 0 {
		t.gap = gap
	} else {
		t.gap += (gap - t.gap) / 8
	}
	t.mu.Unlock()
}

// holdOf is how long t keeps its forwarder after its last rows: four
// times the smoothed time between them, within MinHold and MaxHold.
func (f *Fleet) holdOf(t *tenant) time.Duration {
	t.mu.Lock()
	gap := t.gap
	t.mu.Unlock()
	return min(max(4*gap, f.cfg.MinHold), f.cfg.MaxHold)
}

// watchHold stops t's forwarder once it has found no rows for its hold
// time and nothing of its outbox is pending.
func (f *Fleet) watchHold(t *tenant) {
	hold := f.holdOf(t)
	wait := time.Until(time.Unix(0, t.lastRows.Load()).Add(hold))
	t.hold = time.AfterFunc(max(wait, 10*time.Millisecond), func() {
		f.do(func() {
			if t.state != hot {
				return
			}
			if time.Since(time.Unix(0, t.lastRows.Load())) < f.holdOf(t) {
				f.watchHold(t)
				return
			}
			fwd := t.fwd
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				s, err := fwd.Status(ctx)
				f.do(func() {
					if t.state != hot || t.fwd != fwd {
						return
					}
					if err == nil && s.Pending == 0 {
						t.mu.Lock()
						t.stats, t.lookedAt = s.OutboxStats, time.Now()
						t.mu.Unlock()
						f.stop(t)
						return
					}
					// Rows wait (a retry, a backlog): hold on.
					t.lastRows.Store(time.Now().UnixNano())
					f.watchHold(t)
				})
			}()
		})
	})
}

// stop closes t's forwarder; t goes idle once it has handed over.
func (f *Fleet) stop(t *tenant) {
	if t.hold != nil {
		t.hold.Stop()
	}
	t.state = stopping
	fwd := t.fwd
	go func() {
		if err := fwd.Close(); err != nil {
			f.logger(t.spec).Error("millbox fleet: a tenant's forwarder did not stop in time", err, nil)
		}
		f.do(func() {
			t.fwd, t.state = nil, idle
			t.mu.Lock()
			next := t.stats.NextDue
			t.mu.Unlock()
			f.idle(t, next)
			if t.dirty && f.mayStart(t) {
				f.start(t, true)
			}
		})
	}()
}

// refresh publishes the loop's tenants for Status and the doorbells.
func (f *Fleet) refresh() {
	all := make([]*tenant, 0, len(f.tenants))
	byServer := map[*server][]Tenant{}
	for _, t := range f.tenants {
		all = append(all, t)
		byServer[t.srv] = append(byServer[t.srv], t.spec)
	}
	f.statusMu.Lock()
	f.snapshot = all
	f.statusMu.Unlock()
	for _, s := range f.servers {
		s.setTenants(f, byServer[s])
	}
}

// tenantSource is a tenant's polling source: the whole outbox, held by
// the fleet's lease on the tenant rather than by leases of its own.
type tenantSource struct {
	poll  polling.Source
	owner func() time.Time
}

// Validate implements forwarder.Source.
func (s tenantSource) Validate() error { return s.poll.Validate() }

// Open implements forwarder.Source.
func (s tenantSource) Open(env source.Env) (source.Source, error) {
	env.Owner = s.owner
	return s.poll.Open(env)
}
