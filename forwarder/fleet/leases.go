package fleet

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/retry"
	"github.com/millbox/millbox/sqladapters"
)

// The leases: an instance holds the tenants whose owner it is in the
// catalog while its member row is live, renewed every LeaseTTL/3. It
// counts as holding them until 90% of LeaseTTL after the renewal started,
// on its own clock, so it stops publishing strictly before another
// instance may take them over. Shares go by rank: with n live members
// sorted by name and T tenants, the member of rank r holds
// floor(T/n) + (1 if r < T mod n), so the shares add up to T and no
// instance keeps claiming. An instance reads its owned set and the
// catalog only when the members or the catalog's version changed, so at
// steady state it runs two cheap queries a tick and a heartbeat per
// renewal: no write per tenant.

// join announces this instance, so that instances starting together
// split the tenants from their first claim, and checks that the control
// tables exist.
func (f *Fleet) join(ctx context.Context) error {
	start := time.Now()
	if _, err := f.cfg.Store.Heartbeat(ctx, f.cfg.Control, f.cfg.InstanceID, f.cfg.LeaseTTL); err != nil {
		return err
	}
	f.until.Store(start.Add(f.cfg.LeaseTTL - f.cfg.LeaseTTL/10).UnixNano())
	return nil
}

// leave gives every tenant back at once and removes the member row.
func (f *Fleet) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f.until.Store(0)
	if err := f.cfg.Store.Leave(ctx, f.cfg.Control, f.cfg.InstanceID); err != nil {
		f.cfg.Logger.Error("millbox fleet: leave the members on close; the tenants move after LeaseTTL", err, nil)
	}
}

// leaseState is the lease loop's.
type leaseState struct {
	members  []string
	version  int64
	total    int // tenants in the catalog, not removed
	owned    map[string]sqladapters.FleetTenant
	renewed  time.Time
	catalog  time.Time // when the application's list was last synced
	lastLog  time.Time
	started  bool
	failures retry.Backoff
}

// leaseLoop keeps this instance's share, every tick (a quarter of
// CatalogInterval, at most a second), until ctx ends.
func (f *Fleet) leaseLoop(ctx context.Context) {
	ls := &leaseState{version: -1, failures: retry.Backoff{Policy: retry.Operations}}
	tick := min(f.cfg.CatalogInterval, time.Second)
	// One tick before the first claim: instances that start together
	// see each other.
	sleep(ctx, tick)
	for ctx.Err() == nil {
		wait := tick
		if err := f.leaseRound(ctx, ls); err != nil && ctx.Err() == nil {
			wait = max(wait, ls.failures.Next(err))
			if time.Since(ls.lastLog) > 10*time.Second {
				ls.lastLog = time.Now()
				f.cfg.Logger.Error("millbox fleet: control database; the tenants stop publishing when the lease runs out", err,
					watermill.LogFields{"retry_in": wait.String()})
			}
		} else {
			ls.failures.Reset()
		}
		sleep(ctx, wait)
	}
}

func (f *Fleet) leaseRound(ctx context.Context, ls *leaseState) error {
	st, db := f.cfg.Store, f.cfg.Control
	renew := time.Since(ls.renewed) >= f.cfg.LeaseTTL/3
	if renew {
		start := time.Now()
		renewed, err := st.Heartbeat(ctx, db, f.cfg.InstanceID, f.cfg.LeaseTTL)
		if err != nil {
			return fmt.Errorf("heartbeat: %w", err)
		}
		if !renewed && ls.started {
			// The member row had expired (this instance was frozen, or
			// the control database away for longer than LeaseTTL): its
			// tenants were given up and may be another's by now. Stop
			// them all; the claims below start afresh.
			f.cfg.Logger.Error("millbox fleet: this instance's lease had run out; letting go of its tenants and claiming anew", nil, nil)
			var all []string
			if f.sync(func() {
				for id := range f.tenants {
					all = append(all, id)
				}
			}) {
				if err := f.letGo(ctx, all); err != nil {
					return err
				}
			}
		}
		ls.renewed = start
		f.until.Store(start.Add(f.cfg.LeaseTTL - f.cfg.LeaseTTL/10).UnixNano())
	}
	if f.cfg.Tenants != nil && time.Since(ls.catalog) >= f.cfg.CatalogInterval {
		ls.catalog = time.Now()
		if err := f.syncCatalog(ctx); err != nil {
			f.cfg.Logger.Error("millbox fleet: cannot bring the catalog in line with Config.Tenants", err, nil)
		}
	}
	members, err := st.LiveMembers(ctx, db)
	if err != nil {
		return fmt.Errorf("members: %w", err)
	}
	version, err := st.CatalogVersion(ctx, db)
	if err != nil {
		return fmt.Errorf("catalog version: %w", err)
	}
	if !renew && ls.started && version == ls.version && slices.Equal(members, ls.members) {
		return nil
	}
	if version != ls.version {
		all, err := st.Tenants(ctx, db)
		if err != nil {
			return fmt.Errorf("catalog: %w", err)
		}
		ls.total = 0
		for _, t := range all {
			if !t.Removed {
				ls.total++
			}
		}
	}
	owned, err := st.OwnedTenants(ctx, db, f.cfg.InstanceID)
	if err != nil {
		return fmt.Errorf("owned tenants: %w", err)
	}
	share := shareOf(f.cfg.InstanceID, members, ls.total)
	var live, removed []sqladapters.FleetTenant
	for _, t := range owned {
		if t.Removed {
			removed = append(removed, t)
		} else {
			live = append(live, t)
		}
	}
	switch {
	case len(live) < share:
		claimed, err := st.ClaimTenants(ctx, db, f.cfg.InstanceID, share-len(live))
		if err != nil {
			return fmt.Errorf("claim tenants: %w", err)
		}
		live = append(live, claimed...)
	case len(live) > share:
		// Give back the excess once their forwarders stopped, so that the
		// next holder never meets a call of this one.
		excess := f.pickExcess(live, len(live)-share)
		if err := f.letGo(ctx, excess); err != nil {
			return err
		}
		if err := st.ReleaseTenants(ctx, db, f.cfg.InstanceID, excess); err != nil {
			return fmt.Errorf("release tenants: %w", err)
		}
		live = slices.DeleteFunc(live, func(t sqladapters.FleetTenant) bool { return slices.Contains(excess, t.ID) })
	}
	if len(removed) > 0 {
		ids := make([]string, len(removed))
		for i, t := range removed {
			ids[i] = t.ID
		}
		if err := f.letGo(ctx, ids); err != nil {
			return err
		}
		if _, err := st.DeleteRemoved(ctx, db, f.cfg.InstanceID, ids); err != nil {
			return fmt.Errorf("delete removed tenants: %w", err)
		}
	}
	ls.members, ls.version = members, version
	f.do(func() { f.own(live) })
	if !ls.started {
		ls.started = true
		f.life.Started()
	}
	return nil
}

// shareOf is the number of tenants instance holds among members, by rank.
func shareOf(instance string, members []string, total int) int {
	n := len(members)
	rank := slices.Index(members, instance)
	if rank < 0 {
		// Not counted yet (the heartbeat raced the look): the share of one
		// more member.
		n++
		rank = n - 1
	}
	share := total / n
	if rank < total%n {
		share++
	}
	return share
}

// pickExcess chooses n tenants to give back: idle ones first.
func (f *Fleet) pickExcess(live []sqladapters.FleetTenant, n int) []string {
	busy := map[string]bool{}
	if !f.sync(func() {
		for id, t := range f.tenants {
			busy[id] = t.state != idle
		}
	}) {
		return nil
	}
	ids := make([]string, 0, len(live))
	for _, t := range live {
		ids = append(ids, t.ID)
	}
	slices.SortStableFunc(ids, func(a, b string) int {
		switch {
		case busy[a] == busy[b]:
			return 0
		case busy[a]:
			return 1
		}
		return -1
	})
	return ids[:n]
}

// letGo stops the tenants' forwarders and waits until they have.
func (f *Fleet) letGo(ctx context.Context, ids []string) error {
	done := make(chan struct{})
	if !f.do(func() { f.release(ids, done) }) {
		return ctx.Err()
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// syncCatalog makes the catalog match Config.Tenants: it puts what is new
// or changed and removes what is gone.
func (f *Fleet) syncCatalog(ctx context.Context) error {
	want, err := f.cfg.Tenants()
	if err != nil {
		return fmt.Errorf("Config.Tenants: %w", err)
	}
	have, err := f.cfg.Store.Tenants(ctx, f.cfg.Control)
	if err != nil {
		return err
	}
	cur := make(map[string]sqladapters.FleetTenant, len(have))
	for _, t := range have {
		cur[t.ID] = t
	}
	var put []sqladapters.FleetTenant
	seen := make(map[string]bool, len(want))
	for _, t := range want {
		if err := f.cfg.ValidateTenant(t); err != nil {
			f.cfg.Logger.Error("millbox fleet: Config.Tenants returned a tenant the fleet cannot serve; leaving it out", err, nil)
			continue
		}
		seen[t.ID] = true
		row := sqladapters.FleetTenant{ID: t.ID, Server: t.Server, Database: t.Database, Schema: t.Schema}
		if c, ok := cur[t.ID]; !ok || c.Removed || c.Server != row.Server || c.Database != row.Database || c.Schema != row.Schema {
			put = append(put, row)
		}
	}
	var gone []string
	for id, t := range cur {
		if !seen[id] && !t.Removed {
			gone = append(gone, id)
		}
	}
	if len(put) > 0 {
		if err := f.cfg.Store.PutTenants(ctx, f.cfg.Control, put); err != nil {
			return err
		}
	}
	if len(gone) > 0 {
		return f.cfg.Store.RemoveTenants(ctx, f.cfg.Control, gone)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
