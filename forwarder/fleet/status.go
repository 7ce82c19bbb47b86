package fleet

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// Status is what an instance of the fleet knows of the tenants it holds.
type Status struct {
	// Instance is this instance's InstanceID; Running whether its Run is
	// serving.
	Instance string
	Running  bool
	// Tenants are the tenants this instance holds, the largest backlog
	// first, then the oldest pending message.
	Tenants []TenantStatus
	// Totals add up the tenants.
	Totals Totals
}

// Totals add up the tenants of a Status.
type Totals struct {
	Tenants, Hot, Down int
	Pending, Dead      int64
	// OldestPendingAge is the largest of the tenants'.
	OldestPendingAge time.Duration
}

// TenantStatus is one tenant as its instance knows it.
type TenantStatus struct {
	Tenant
	// State is "hot" while its forwarder runs, "idle" while it holds no
	// connection, "starting" or "stopping" in between.
	State string
	// Down tells that its last start failed (unreachable database,
	// missing tables); LastError says why.
	Down        bool
	LastError   string
	LastErrorAt time.Time
	// Stats is the outbox's backlog: read now for a hot tenant, as of
	// LookedAt for an idle one.
	sqladapters.OutboxStats
	LookedAt time.Time
	// LastActivity is when a read last found rows.
	LastActivity time.Time
}

// Status reports the tenants this instance holds. A hot tenant's backlog
// is read from its database (at most eight at a time, within ctx); an
// idle one's is what the last look saw, so Status opens no connection to
// an idle tenant.
func (f *Fleet) Status(ctx context.Context) (Status, error) {
	f.statusMu.Lock()
	tenants := slices.Clone(f.snapshot)
	f.statusMu.Unlock()
	st := Status{Instance: f.cfg.InstanceID, Running: f.running(), Tenants: make([]TenantStatus, len(tenants))}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, t := range tenants {
		ts := TenantStatus{Tenant: t.spec, State: f.stateOf(t)}
		t.mu.Lock()
		ts.Down, ts.LastError, ts.LastErrorAt = t.down, t.lastErr, t.lastErrAt
		ts.OutboxStats, ts.LookedAt = t.stats, t.lookedAt
		t.mu.Unlock()
		if n := t.lastRows.Load(); n != 0 {
			ts.LastActivity = time.Unix(0, n)
		}
		st.Tenants[i] = ts
		if fwd := f.forwarderOf(t); fwd != nil {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if s, err := fwd.Status(ctx); err == nil {
					st.Tenants[i].OutboxStats, st.Tenants[i].LookedAt = s.OutboxStats, time.Now()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(st.Tenants, func(a, b TenantStatus) int {
		return cmp.Or(cmp.Compare(b.Pending, a.Pending), cmp.Compare(b.OldestPendingAge, a.OldestPendingAge), cmp.Compare(a.ID, b.ID))
	})
	for _, ts := range st.Tenants {
		st.Totals.Tenants++
		st.Totals.Pending += ts.Pending
		st.Totals.Dead += ts.Dead
		st.Totals.OldestPendingAge = max(st.Totals.OldestPendingAge, ts.OldestPendingAge)
		if ts.State == hot.String() {
			st.Totals.Hot++
		}
		if ts.Down {
			st.Totals.Down++
		}
	}
	return st, ctx.Err()
}

// stateOf reads t's state from the loop.
func (f *Fleet) stateOf(t *tenant) string {
	s := idle.String()
	f.sync(func() { s = t.state.String() })
	return s
}

// forwarderOf returns t's forwarder while it is hot.
func (f *Fleet) forwarderOf(t *tenant) (fwd *forwarder.Forwarder) {
	f.sync(func() {
		if t.state == hot {
			fwd = t.fwd
		}
	})
	return fwd
}

func (f *Fleet) running() bool {
	select {
	case <-f.life.Running():
		return f.life.Ready(context.Background()) == nil
	default:
		return false
	}
}

// HealthOptions configures HealthHandler.
type HealthOptions struct {
	// MaxDown makes the readiness check fail while more tenants than this
	// are down. Defaults to 0: any tenant down fails it.
	MaxDown int
	// MaxPendingAge makes it fail while a tenant's oldest pending message
	// is older. Defaults to 0: no limit.
	MaxPendingAge time.Duration
	// Timeout bounds each Status call. Defaults to five seconds.
	Timeout time.Duration
}

// HealthHandler serves /healthz (the process serves HTTP) and /readyz
// (the fleet runs, no more tenants down than MaxDown, no pending message
// older than MaxPendingAge), with a JSON body naming the tenants that are
// down and why.
func HealthHandler(f *Fleet, opts HealthOptions) http.Handler {
	opts.Timeout = cmp.Or(opts.Timeout, 5*time.Second)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		type down struct {
			Tenant string `json:"tenant"`
			Error  string `json:"error"`
		}
		body := struct {
			Status  string   `json:"status"`
			Reasons []string `json:"reasons,omitempty"`
			Totals  *Totals  `json:"totals,omitempty"`
			Down    []down   `json:"down,omitempty"`
		}{Status: "ok"}
		code := http.StatusOK
		switch path.Base(r.URL.Path) {
		case "healthz", "livez":
		case "readyz":
			ctx, cancel := context.WithTimeout(r.Context(), opts.Timeout)
			defer cancel()
			st, err := f.Status(ctx)
			body.Status, body.Totals = "ready", &st.Totals
			if err != nil {
				body.Reasons = append(body.Reasons, "cannot read the fleet's status: "+err.Error())
			}
			if !st.Running {
				body.Reasons = append(body.Reasons, "the fleet is not running")
			}
			for _, t := range st.Tenants {
				if t.Down {
					body.Down = append(body.Down, down{Tenant: t.ID, Error: t.LastError})
				}
				if opts.MaxPendingAge > 0 && t.OldestPendingAge > opts.MaxPendingAge {
					body.Reasons = append(body.Reasons, fmt.Sprintf("tenant %s: the oldest pending message is %v old, over the limit of %v",
						t.ID, t.OldestPendingAge.Round(time.Second), opts.MaxPendingAge))
				}
			}
			if len(body.Down) > opts.MaxDown {
				body.Reasons = append(body.Reasons, fmt.Sprintf("%d tenants are down (at most %d allowed)", len(body.Down), opts.MaxDown))
			}
			if len(body.Reasons) > 0 {
				body.Status, code = "not_ready", http.StatusServiceUnavailable
			}
		default:
			body.Status, code = "error", http.StatusNotFound
			body.Reasons = []string{"unknown check; use /healthz or /readyz"}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}
