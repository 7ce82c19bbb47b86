package fleet

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/startstop"
)

// Fleet forwards the tenants it holds: this instance's share of the
// catalog. See the package doc for how it finds new rows and what an idle
// tenant costs.
type Fleet struct {
	cfg    Config
	budget *budget
	life   startstop.Base

	// until is the end of this instance's lease (unix ns, local clock):
	// the renewal's start plus 90% of LeaseTTL. Past it, the tenants'
	// forwarders publish nothing.
	until atomic.Int64

	events chan func() // run on the loop
	quit   chan struct{}

	ringMu sync.Mutex
	rung   map[string]bool // rings not yet handled
	ringCh chan struct{}

	// The loop's.
	tenants map[string]*tenant
	servers map[string]*server
	named   int  // tenants named in metrics (TenantAttribute)
	closing bool // Run's context ended: start nothing more

	// What Status reads: the tenants, a copy of the loop's map.
	statusMu sync.Mutex
	snapshot []*tenant
}

// New validates cfg and returns a fleet instance. It starts nothing: call
// Run.
func New(cfg Config) (*Fleet, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{
		cfg:     cfg,
		budget:  newBudget(cfg.MaxConns, cfg.MaxConnsPerServer),
		events:  make(chan func(), 256),
		quit:    make(chan struct{}),
		rung:    map[string]bool{},
		ringCh:  make(chan struct{}, 1),
		tenants: map[string]*tenant{},
		servers: map[string]*server{},
	}
	for name, s := range cfg.Servers {
		f.servers[name] = &server{name: name, s: s, handles: map[*handle]bool{}}
	}
	return f, nil
}

// Running is closed once the fleet runs (it joined the members and made
// its first claim) or once Run returned, whichever comes first.
func (f *Fleet) Running() <-chan struct{} { return f.life.Running() }

// Ready waits until the fleet runs and returns nil, or returns why it will
// not: the error Run returned, ErrClosed, or ctx's error.
func (f *Fleet) Ready(ctx context.Context) error { return f.life.Ready(ctx) }

// Close stops Run: the tenants' forwarders finish their calls and hand
// over, this instance leaves the members so that its tenants move at
// once. It waits at most the template's CloseTimeout (30 s by default)
// plus ten seconds.
func (f *Fleet) Close() error {
	return f.life.Close(closeTimeout(f.cfg.Forwarder)+10*time.Second, "fleet")
}

func closeTimeout(c forwarder.Config) time.Duration {
	if c.CloseTimeout > 0 {
		return c.CloseTimeout
	}
	return forwarder.DefaultCloseTimeout
}

// Run serves this instance's share of the tenants until ctx ends or Close
// is called. It returns an error when the fleet cannot start (the control
// tables missing, the control database unreachable); later failures of
// the control database or of a tenant are logged and retried.
func (f *Fleet) Run(ctx context.Context) error {
	ctx, err := f.life.Begin(ctx)
	if err != nil {
		return err
	}
	return f.life.End(f.run(ctx))
}

func (f *Fleet) run(ctx context.Context) error {
	if err := f.join(ctx); err != nil {
		err = fmt.Errorf("millbox fleet: start: %w", err)
		f.cfg.Logger.Error("millbox fleet: cannot start", err, nil)
		return err
	}
	var wg sync.WaitGroup
	leasesDone := make(chan struct{})
	wg.Go(func() {
		defer close(leasesDone)
		f.leaseLoop(ctx)
	})
	wg.Go(func() { f.ringLoop(ctx) })
	f.loop(ctx, leasesDone)
	wg.Wait()
	f.leave()
	return nil
}

// loop runs the events until ctx ended, every tenant has stopped and the
// lease loop has ended.
func (f *Fleet) loop(ctx context.Context, leasesDone <-chan struct{}) {
	defer close(f.quit)
	done := ctx.Done()
	// leases is leasesDone once every tenant has stopped, so that the
	// lease loop's end wakes the loop: it may end after the last event.
	var leases <-chan struct{}
	for {
		select {
		case <-done:
			done = nil
			f.closing = true
			for _, t := range f.tenants {
				f.drop(t)
			}
		case fn := <-f.events:
			fn()
		case <-leases:
		}
		if done == nil && f.stopped() {
			select {
			case <-leasesDone:
				f.stopDoorbells()
				return
			default:
				leases = leasesDone
			}
		}
	}
}

// stopped tells whether every tenant's forwarder has ended.
func (f *Fleet) stopped() bool {
	for _, t := range f.tenants {
		if t.state != idle {
			return false
		}
	}
	return true
}

// do runs fn on the loop; false once the loop has ended.
func (f *Fleet) do(fn func()) bool {
	select {
	case f.events <- fn:
		return true
	case <-f.quit:
		return false
	}
}

// sync runs fn on the loop and waits for it; false once the loop ended.
func (f *Fleet) sync(fn func()) bool {
	done := make(chan struct{})
	if !f.do(func() { fn(); close(done) }) {
		return false
	}
	select {
	case <-done:
		return true
	case <-f.quit:
		return false
	}
}

// ring notes that tenant may have new rows; any goroutine, never blocks.
func (f *Fleet) ring(tenant string) {
	f.ringMu.Lock()
	f.rung[tenant] = true
	f.ringMu.Unlock()
	select {
	case f.ringCh <- struct{}{}:
	default:
	}
}

// ringLoop hands the rings to the loop in batches.
func (f *Fleet) ringLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.ringCh:
		}
		f.ringMu.Lock()
		rung := f.rung
		f.rung = map[string]bool{}
		f.ringMu.Unlock()
		f.do(func() {
			for id := range rung {
				if t := f.tenants[id]; t != nil {
					f.onRing(t)
				}
			}
		})
	}
}

// valid tells until when this instance's tenants are its own.
func (f *Fleet) valid() time.Time { return time.Unix(0, f.until.Load()) }

// logger returns the fleet's logger with the tenant's fields.
func (f *Fleet) logger(t Tenant) watermill.LoggerAdapter {
	return f.cfg.Logger.With(watermill.LogFields{"tenant": t.ID, "server": t.Server})
}

// PutTenants adds tenants to the catalog, or changes them: every
// instance of the fleet sees them within CatalogInterval, and the one
// that takes a new tenant forwards it at once.
func (f *Fleet) PutTenants(ctx context.Context, tenants ...Tenant) error {
	rows := make([]sqladapters.FleetTenant, len(tenants))
	for i, t := range tenants {
		if err := f.cfg.ValidateTenant(t); err != nil {
			return err
		}
		rows[i] = sqladapters.FleetTenant{ID: t.ID, Server: t.Server, Database: t.Database, Schema: t.Schema}
	}
	return f.cfg.Store.PutTenants(ctx, f.cfg.Control, rows)
}

// RemoveTenants removes tenants from the catalog: the instance that holds
// one lets it go (its forwarder finishes its calls) and deletes it. The
// tenant's outbox is left as it is.
func (f *Fleet) RemoveTenants(ctx context.Context, ids ...string) error {
	return f.cfg.Store.RemoveTenants(ctx, f.cfg.Control, ids)
}
