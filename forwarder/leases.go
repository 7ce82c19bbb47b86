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
// LeaseTTL/3.
func (f *Forwarder) leaseLoop(ctx context.Context, ready chan<- struct{}) {
	interval := f.cfg.LeaseTTL / 3
	readyOnce := false
	for {
		if err := f.leaseRound(ctx); err != nil && ctx.Err() == nil {
			f.cfg.Logger.Error("millbox forwarder: lease renewal failed; publishing stops when the leases run out", err, nil)
		} else if !readyOnce && ctx.Err() == nil {
			readyOnce = true
			close(ready)
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (f *Forwarder) leaseRound(ctx context.Context) error {
	d, db, id, ttl := f.cfg.Dialect, f.cfg.DB, f.cfg.InstanceID, f.cfg.LeaseTTL
	start := time.Now()
	if _, err := d.Heartbeat(id, ttl).Exec(ctx, db); err != nil {
		return fmt.Errorf("heartbeat: %w", d.ClassifyError(err))
	}
	members, err := queryInt(ctx, db, d.CountMembers())
	if err != nil {
		return fmt.Errorf("count members: %w", d.ClassifyError(err))
	}
	share := (f.cfg.Partitions + max(members, 1) - 1) / max(members, 1)
	if _, err := d.RenewPartitions(id, ttl).Exec(ctx, db); err != nil {
		return fmt.Errorf("renew leases: %w", d.ClassifyError(err))
	}
	owned, err := f.ownedPartitions(ctx)
	if err != nil {
		return err
	}
	switch {
	case len(owned) > share:
		// Release only between rounds, after the deletes of published
		// rows landed, so the next owner never sees a row in flight.
		f.batchMu.Lock()
		f.ackWG.Wait()
		extra := owned[share:]
		_, err := d.ReleasePartitions(id, extra).Exec(ctx, db)
		if err == nil {
			owned = owned[:share]
			f.setOwned(owned, start)
			f.discardPrefetch = true
		}
		f.batchMu.Unlock()
		if err != nil {
			return fmt.Errorf("release partitions: %w", d.ClassifyError(err))
		}
		f.cfg.Logger.Debug("millbox forwarder: released partitions", watermill.LogFields{"partitions": fmt.Sprint(extra)})
		return nil
	case len(owned) < share:
		if _, err := d.ClaimPartitions(id, ttl, share-len(owned)).Exec(ctx, db); err != nil {
			return fmt.Errorf("claim partitions: %w", d.ClassifyError(err))
		}
		if owned, err = f.ownedPartitions(ctx); err != nil {
			return err
		}
	}
	f.setOwned(owned, start)
	return nil
}

func (f *Forwarder) ownedPartitions(ctx context.Context) ([]int, error) {
	rows, err := f.cfg.Dialect.OwnedPartitions(f.cfg.InstanceID).Query(ctx, f.cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", f.cfg.Dialect.ClassifyError(err))
	}
	defer rows.Close()
	var owned []int
	for rows.Next() {
		var p int
		if err := rows.Scan(&p); err != nil {
			return nil, fmt.Errorf("read leases: %w", err)
		}
		owned = append(owned, p)
	}
	return owned, rows.Err()
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
		if _, err := d.ReleasePartitions(f.cfg.InstanceID, owned).Exec(ctx, f.cfg.DB); err != nil {
			f.cfg.Logger.Error("millbox forwarder: release partitions on close; they move after the lease TTL", err, nil)
		}
	}
	if _, err := d.RemoveMember(f.cfg.InstanceID).Exec(ctx, f.cfg.DB); err != nil {
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
