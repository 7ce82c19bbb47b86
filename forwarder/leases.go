package forwarder

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// leaseLoop keeps this instance's fair share of partitions: it heartbeats,
// renews its leases, claims free or expired partitions up to
// ceil(partitions / live instances) and releases the excess, every
// LeaseTTL/3. Between renewals it counts the live instances every
// PollInterval, so that when one leaves (or joins) the partitions move
// within a poll interval rather than a renewal later.
func (f *Forwarder) leaseLoop(ctx context.Context, ready chan<- struct{}) {
	interval := f.cfg.LeaseTTL / 3
	tick := min(interval, f.cfg.PollInterval)
	readyOnce := false
	members := -1
	var lastRound time.Time
	for {
		// A full round is due at each renewal, and at every tick while
		// this instance holds less than its share (partitions another
		// instance is giving back become free at any moment).
		full := time.Since(lastRound) >= interval || f.short.Load()
		if !full {
			// Between renewals: only look whether the share changed.
			n, err := f.cfg.Dialect.CountMembers(ctx, f.cfg.DB)
			full = err == nil && n != members
		}
		if full {
			lastRound = time.Now()
			n, err := f.leaseRound(ctx)
			if err != nil && ctx.Err() == nil {
				f.reportError(err)
				f.cfg.Logger.Error("millbox forwarder: lease renewal failed; publishing stops when the leases run out", err, nil)
				f.signal()
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
func (f *Forwarder) leaseRound(ctx context.Context) (int, error) {
	d, db, id, ttl := f.cfg.Dialect, f.cfg.DB, f.cfg.InstanceID, f.cfg.LeaseTTL
	start := time.Now()
	if err := d.Heartbeat(ctx, db, id, ttl); err != nil {
		return 0, fmt.Errorf("heartbeat: %w", err)
	}
	members, err := d.CountMembers(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("count members: %w", err)
	}
	share := (f.cfg.Partitions + max(members, 1) - 1) / max(members, 1)
	if err := d.RenewPartitions(ctx, db, id, ttl); err != nil {
		return 0, fmt.Errorf("renew leases: %w", err)
	}
	owned, err := f.ownedPartitions(ctx)
	if err != nil {
		return 0, err
	}
	switch {
	case len(owned) > share:
		// Release only while nothing is in flight and the deletes of
		// published rows landed, so the next owner never sees a row that
		// is being published.
		extra := owned[share:]
		if err := f.quiet(ctx, func() error {
			if err := d.ReleasePartitions(ctx, db, id, extra); err != nil {
				return err
			}
			f.setOwned(owned[:share], start)
			f.short.Store(false)
			return nil
		}); err != nil {
			return 0, fmt.Errorf("release partitions: %w", err)
		}
		f.cfg.Logger.Debug("millbox forwarder: released partitions", watermill.LogFields{"partitions": fmt.Sprint(extra)})
		return members, nil
	case len(owned) < share:
		if err := d.ClaimPartitions(ctx, db, id, ttl, share-len(owned)); err != nil {
			return 0, fmt.Errorf("claim partitions: %w", err)
		}
		if owned, err = f.ownedPartitions(ctx); err != nil {
			return 0, err
		}
	}
	f.setOwned(owned, start)
	f.short.Store(len(owned) < share)
	return members, nil
}

// quiet runs fn while the dispatcher has nothing in flight.
func (f *Forwarder) quiet(ctx context.Context, fn func() error) error {
	req := &releaseReq{quiet: make(chan struct{}), done: make(chan struct{})}
	defer close(req.done)
	select {
	case f.releases <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-req.quiet:
	case <-ctx.Done():
		return ctx.Err()
	}
	return fn()
}

func (f *Forwarder) ownedPartitions(ctx context.Context) ([]int, error) {
	owned, err := f.cfg.Dialect.OwnedPartitions(ctx, f.cfg.DB, f.cfg.InstanceID)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	return owned, nil
}

// setOwned records the leases. They count as valid until 90% of the TTL
// after the renewal started, measured on the local clock, so this instance
// stops publishing strictly before another one can take them over.
func (f *Forwarder) setOwned(owned []int, renewedAt time.Time) {
	f.leaseMu.Lock()
	changed := !slices.Equal(owned, f.owned)
	f.owned = owned
	f.leaseDeadline = renewedAt.Add(f.cfg.LeaseTTL - f.cfg.LeaseTTL/10)
	f.leaseMu.Unlock()
	if changed {
		f.cfg.Logger.Debug("millbox forwarder: partitions", watermill.LogFields{"instance": f.cfg.InstanceID, "owned": fmt.Sprint(owned)})
		f.signal()
	}
}

// leave releases every partition and the member row, so other instances
// take over without waiting for the leases to expire.
func (f *Forwarder) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), min(f.cfg.CloseTimeout, 10*time.Second))
	defer cancel()
	f.leaseMu.Lock()
	owned := f.owned
	f.owned, f.leaseDeadline = nil, time.Time{}
	f.leaseMu.Unlock()
	d := f.cfg.Dialect
	if len(owned) > 0 {
		if err := d.ReleasePartitions(ctx, f.cfg.DB, f.cfg.InstanceID, owned); err != nil {
			f.cfg.Logger.Error("millbox forwarder: release partitions on close; they move after the lease TTL", err, nil)
		}
	}
	if err := d.RemoveMember(ctx, f.cfg.DB, f.cfg.InstanceID); err != nil {
		f.cfg.Logger.Error("millbox forwarder: remove member on close", err, nil)
	}
}

// Partitions returns the partitions this instance currently leases.
func (f *Forwarder) Partitions() []int {
	f.leaseMu.Lock()
	defer f.leaseMu.Unlock()
	if time.Now().After(f.leaseDeadline) {
		return nil
	}
	return slices.Clone(f.owned)
}
