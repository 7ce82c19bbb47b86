package polling

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/millbox/millbox/sqladapters"
)

// announceWait is how long an instance waits after its first heartbeat
// before its first claim, so that instances starting together (within
// this long of each other) see each other and split the partitions from
// the start. It delays every start by as much: short, since instances
// that start further apart get their shares within a tick anyway.
const announceWait = 100 * time.Millisecond

// leaseLoop keeps this instance's fair share of partitions: it heartbeats,
// renews its leases, claims free or expired partitions up to
// ceil(partitions / live instances) and releases the excess, every
// LeaseTTL/3. Between renewals it counts the live instances every quarter
// of a PollInterval, so that when one leaves (or joins) the partitions
// move within a poll interval rather than a renewal later. Before its
// first claim it announces itself and waits announceWait, so that
// instances that start together split the partitions from the start.
func (p *poller) leaseLoop(ctx context.Context, ready chan<- struct{}) {
	interval := p.cfg.LeaseTTL / 3
	tick := max(min(interval, p.cfg.PollInterval/4), 10*time.Millisecond)
	if err := p.heartbeat(ctx); err == nil {
		sleep(ctx, min(tick, announceWait))
	}
	readyOnce := false
	members := -1
	var lastRound time.Time
	for {
		// A full round is due at each renewal, and at every tick while
		// this instance holds less than its share (partitions another
		// instance is giving back become free at any moment).
		full := time.Since(lastRound) >= interval || p.short.Load()
		if !full {
			// Between renewals: only look whether the share changed.
			n, err := p.env.Dialect.CountMembers(ctx, p.env.DB)
			full = err == nil && n != members
		}
		if full {
			lastRound = time.Now()
			n, err := p.leaseRound(ctx)
			if err != nil && ctx.Err() == nil {
				p.env.ReportError(err)
				p.env.Logger.Error("millbox forwarder: lease renewal failed; publishing stops when the leases run out", err, nil)
				p.wake()
			} else if ctx.Err() == nil {
				members = n
				if !readyOnce {
					readyOnce = true
					close(ready)
				}
			}
		}
		t := time.NewTimer(tick)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// leaseRound renews and rebalances the leases and returns the number of
// live instances it saw.
func (p *poller) leaseRound(ctx context.Context) (int, error) {
	d, db, id, ttl := p.env.Dialect, p.env.DB, p.cfg.InstanceID, p.cfg.LeaseTTL
	start := time.Now()
	if err := p.heartbeat(ctx); err != nil {
		return 0, fmt.Errorf("heartbeat: %w", err)
	}
	members, err := d.CountMembers(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("count members: %w", err)
	}
	share := (p.cfg.Partitions + max(members, 1) - 1) / max(members, 1)
	if err := d.RenewPartitions(ctx, db, id, ttl); err != nil {
		return 0, fmt.Errorf("renew leases: %w", err)
	}
	owned, err := p.ownedPartitions(ctx)
	if err != nil {
		return 0, err
	}
	switch {
	case len(owned) > share:
		// Release only while nothing is in flight and the deletes of
		// published rows landed, so the next owner never sees a row that
		// is being published.
		extra := owned[share:]
		if err := p.e.Quiesce(ctx, func() error {
			if err := d.ReleasePartitions(ctx, db, id, extra); err != nil {
				return err
			}
			p.setOwned(owned[:share], start)
			p.short.Store(false)
			return nil
		}); err != nil {
			return 0, fmt.Errorf("release partitions: %w", err)
		}
		p.env.Logger.Debug("millbox forwarder: released partitions", watermill.LogFields{"partitions": fmt.Sprint(extra)})
		return members, nil
	case len(owned) < share:
		if err := d.ClaimPartitions(ctx, db, id, ttl, share-len(owned)); err != nil {
			return 0, fmt.Errorf("claim partitions: %w", err)
		}
		if owned, err = p.ownedPartitions(ctx); err != nil {
			return 0, err
		}
	}
	p.setOwned(owned, start)
	p.short.Store(len(owned) < share)
	return members, nil
}

func (p *poller) ownedPartitions(ctx context.Context) ([]int, error) {
	owned, err := p.env.Dialect.OwnedPartitions(ctx, p.env.DB, p.cfg.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return owned, nil
}

// setOwned records the leases. They count as valid until 90% of the TTL
// after the renewal started, measured on the local clock, so this instance
// stops publishing strictly before another one can take them over.
func (p *poller) setOwned(owned []int, renewedAt time.Time) {
	p.setOwnedUntil(owned, renewedAt.Add(p.cfg.LeaseTTL-p.cfg.LeaseTTL/10))
}

// setOwnedUntil records the partitions held and until when.
func (p *poller) setOwnedUntil(owned []int, deadline time.Time) {
	p.leaseMu.Lock()
	changed := !slices.Equal(owned, p.owned)
	activeChanged := (len(owned) > 0) != (len(p.owned) > 0)
	p.owned = owned
	p.leaseDeadline = deadline
	gone := p.notOwned()
	p.leaseMu.Unlock()
	p.afterOwned(gone)
	if activeChanged && p.env.Active != nil {
		p.env.Active(len(owned) > 0)
	}
	if changed {
		p.env.Logger.Debug("millbox forwarder: partitions", watermill.LogFields{"instance": p.cfg.InstanceID, "owned": fmt.Sprint(owned)})
		p.wake()
	}
}

// leave releases every partition and the member row, so other instances
// take over without waiting for the leases to expire.
func (p *poller) leave() {
	if p.env.Owner != nil {
		p.setOwnedUntil(nil, time.Time{})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(p.env.CloseTimeout, 10*time.Second))
	defer cancel()
	p.leaseMu.Lock()
	owned := p.owned
	p.owned, p.leaseDeadline = nil, time.Time{}
	clear(p.acquired)
	p.leaseMu.Unlock()
	if len(owned) > 0 && p.env.Active != nil {
		p.env.Active(false)
	}
	d := p.env.Dialect
	if len(owned) > 0 {
		if err := d.ReleasePartitions(ctx, p.env.DB, p.cfg.InstanceID, owned); err != nil {
			p.env.Logger.Error("millbox forwarder: release partitions on close; they move after the lease TTL", err, nil)
		}
	}
	if err := d.RemoveMember(ctx, p.env.DB, p.cfg.InstanceID); err != nil {
		p.env.Logger.Error("millbox forwarder: remove member on close", err, nil)
	}
}

// Partitions returns the partitions this instance currently leases.
func (p *poller) Partitions() []int {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	if time.Now().After(p.leaseDeadline) {
		return nil
	}
	return slices.Clone(p.owned)
}

// currentOwned returns the partitions to read; nil with ok means all.
func (p *poller) currentOwned() ([]int, bool) {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	if len(p.owned) == 0 || time.Now().After(p.leaseDeadline) {
		return nil, false
	}
	if p.acquired != nil {
		return p.readable()
	}
	if len(p.owned) == p.cfg.Partitions {
		return nil, true
	}
	return p.owned, true
}

func (p *poller) leaseValid() bool {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	return len(p.owned) > 0 && time.Now().Before(p.leaseDeadline)
}

// heartbeat records that this instance is alive, with the settings every
// instance must agree on. An instance that started later with other
// settings refused to run; this one goes on, and says so.
func (p *poller) heartbeat(ctx context.Context) error {
	err := p.env.Dialect.HeartbeatSettings(ctx, p.env.DB, p.cfg.InstanceID, p.cfg.LeaseTTL, p.env.Settings)
	var mismatch *sqladapters.SettingMismatchError
	if errors.As(err, &mismatch) {
		if time.Since(p.mismatchLogged) > time.Minute {
			p.mismatchLogged = time.Now()
			p.env.ReportError(err)
			p.env.Logger.Error("millbox forwarder: another instance of this outbox runs with other settings", err, nil)
		}
		return nil
	}
	return err
}

// ownerLoop holds every partition while Env.Owner says the outbox is this
// instance's, and none once it is not: the lease is held elsewhere (a
// fleet's lease on a tenant), so nothing is written to the outbox's own
// lease tables. It looks at least every second and halfway to the end of
// the lease, so a renewal extends the deadline in time.
func (p *poller) ownerLoop(ctx context.Context, ready chan<- struct{}) {
	all := make([]int, p.cfg.Partitions)
	for i := range all {
		all[i] = i
	}
	for {
		wait := 100 * time.Millisecond
		if d := p.env.Owner(); time.Now().Before(d) {
			p.setOwnedUntil(all, d)
			wait = max(min(time.Second, time.Until(d)/2), 10*time.Millisecond)
		} else {
			p.setOwnedUntil(nil, time.Time{})
		}
		if ready != nil {
			close(ready)
			ready = nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
