package storetest

import (
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// testFleetClaims claims tenants with several instances: each gets free
// tenants in ID order, never one another owns; releases free only the
// releaser's own; an instance that is not a live member claims nothing.
func testFleetClaims(e *fleetEnv) {
	e.migrated()
	e.put("t0", "t1", "t2", "t3", "t4")
	e.beat("a", time.Minute)
	e.beat("b", time.Minute)
	e.beat("c", time.Minute)
	e.wantIDs("a claimed", e.claim("a", 2), []string{"t0", "t1"})
	e.wantIDs("b claimed", e.claim("b", 10), []string{"t2", "t3", "t4"})
	e.wantIDs("c claimed", e.claim("c", 10), nil)
	e.wantIDs("a owns", e.owned("a"), []string{"t0", "t1"})
	for _, t := range e.tenants() {
		if want := map[bool]string{true: "a", false: "b"}[t.ID < "t2"]; t.Owner != want {
			e.t.Fatalf("tenant %s owned by %q, want %q", t.ID, t.Owner, want)
		}
	}
	e.release("b", "t0", "t1")
	e.release("a")
	e.wantIDs("a owns after b released a's tenants", e.owned("a"), []string{"t0", "t1"})
	e.release("a", "t1")
	e.wantIDs("c claimed after a released t1", e.claim("c", 10), []string{"t1"})

	_, err := e.f.ClaimTenants(e.ctx, e.db, "stranger", 1)
	if !errors.Is(err, sqladapters.ErrNotFleetMember) {
		e.t.Fatalf("ClaimTenants by an instance without a member row: %v, want ErrNotFleetMember", err)
	}
	e.put("t5")
	e.expire("c")
	if _, err := e.f.ClaimTenants(e.ctx, e.db, "c", 1); !errors.Is(err, sqladapters.ErrNotFleetMember) {
		e.t.Fatalf("ClaimTenants by an expired instance: %v, want ErrNotFleetMember", err)
	}
	for _, max := range []int{0, -1} {
		if _, err := e.f.ClaimTenants(e.ctx, e.db, "a", max); err == nil {
			e.t.Fatalf("ClaimTenants with max %d succeeded", max)
		}
	}
	e.wantIDs("a claimed", e.claim("a", 10), []string{"t1", "t5"})
	e.noneInUse("claims")
}

// testFleetRemovedNeverClaimed checks that a removed tenant is claimed by
// nobody, even once its owner is gone, and that the claim that finds it
// ownerless deletes it.
func testFleetRemovedNeverClaimed(e *fleetEnv) {
	e.migrated()
	e.put("t1", "t2")
	e.beat("a", time.Minute)
	e.beat("b", time.Minute)
	e.wantIDs("a claimed", e.claim("a", 5), []string{"t1", "t2"})
	e.remove("t1")
	e.expire("a")
	got := e.tenants()
	if len(got) != 2 || !got[0].Removed || got[0].Owner != "" {
		e.t.Fatalf("catalog after a expired: %+v, want t1 removed without a live owner", got)
	}
	v := e.version()
	e.wantIDs("b claimed", e.claim("b", 5), []string{"t2"})
	e.wantIDs("catalog after b's claim", fleetIDs(e.tenants()), []string{"t2"})
	if e.version() == v {
		e.t.Fatal("the catalog version did not move when the claim deleted the removed tenant")
	}
	e.noneInUse("claims")
}

// testFleetClaimsConcurrent lets several instances claim a few tenants at
// a time, all at once, until none is left: each tenant goes to exactly
// one of them.
func testFleetClaimsConcurrent(e *fleetEnv) {
	e.migrated()
	const tenants, instances, batch = 300, 6, 7
	var ids []string
	for i := range tenants {
		ids = append(ids, fmt.Sprintf("t%03d", i))
	}
	e.put(ids...)
	claimed := make([][]string, instances)
	errs := make(chan error, instances)
	for i := range instances {
		instance := fmt.Sprint("i", i)
		e.beat(instance, time.Minute)
		go func() {
			for {
				ts, err := e.f.ClaimTenants(e.ctx, e.db, instance, batch)
				if err != nil || len(ts) == 0 {
					errs <- err
					return
				}
				claimed[i] = append(claimed[i], fleetIDs(ts)...)
			}
		}()
	}
	e.check(errors.Join(collect(errs)...), "concurrent ClaimTenants")
	owner := map[string]string{}
	for i, got := range claimed {
		instance := fmt.Sprint("i", i)
		for _, id := range got {
			if other, ok := owner[id]; ok {
				e.t.Fatalf("tenant %s claimed by %s and %s", id, other, instance)
			}
			owner[id] = instance
		}
		slices.Sort(got)
		e.wantIDs(instance+" owns", e.owned(instance), got)
	}
	if len(owner) != tenants {
		e.t.Fatalf("%d of %d tenants claimed", len(owner), tenants)
	}
	e.noneInUse("concurrent claims")
}

// testFleetClaimsChurn runs instances that claim, release, leave and
// join again, all at once, each keeping what it believes it owns, as a
// fleet does: it stops believing before it releases or leaves, and
// believes what a claim returned. No claim may return a tenant another
// instance believes it owns, and at the end the catalog's owners are
// what the instances believe.
func testFleetClaimsChurn(e *fleetEnv) {
	e.migrated()
	const tenants, instances, rounds = 60, 4, 25
	var ids []string
	for i := range tenants {
		ids = append(ids, fmt.Sprintf("t%02d", i))
	}
	e.put(ids...)
	var (
		mu      sync.Mutex
		beliefs = map[string]string{} // tenant → instance
	)
	forget := func(instance string, which func(string) bool) []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for id, owner := range beliefs {
			if owner == instance && which(id) {
				delete(beliefs, id)
				out = append(out, id)
			}
		}
		return out
	}
	errs := make(chan error, instances)
	for i := range instances {
		instance := fmt.Sprint("i", i)
		rnd := rand.New(rand.NewPCG(uint64(i), 1))
		go func() {
			errs <- func() error {
				for range rounds {
					renewed, err := e.f.Heartbeat(e.ctx, e.db, instance, time.Minute)
					if err != nil {
						return fmt.Errorf("Heartbeat: %w", err)
					}
					if !renewed {
						if held := forget(instance, func(string) bool { return true }); len(held) > 0 {
							return fmt.Errorf("%s joined afresh while it held %q", instance, held)
						}
					}
					ts, err := e.f.ClaimTenants(e.ctx, e.db, instance, 1+rnd.IntN(6))
					if err != nil {
						return fmt.Errorf("ClaimTenants: %w", err)
					}
					mu.Lock()
					for _, t := range ts {
						if other, ok := beliefs[t.ID]; ok {
							mu.Unlock()
							return fmt.Errorf("%s claimed %s, which %s owns", instance, t.ID, other)
						}
						beliefs[t.ID] = instance
					}
					mu.Unlock()
					switch rnd.IntN(8) {
					case 0:
						forget(instance, func(string) bool { return true })
						if err := e.f.Leave(e.ctx, e.db, instance); err != nil {
							return fmt.Errorf("Leave: %w", err)
						}
					case 1, 2, 3:
						gone := forget(instance, func(string) bool { return rnd.IntN(3) == 0 })
						if err := e.f.ReleaseTenants(e.ctx, e.db, instance, gone); err != nil {
							return fmt.Errorf("ReleaseTenants: %w", err)
						}
					}
				}
				return nil
			}()
		}()
	}
	e.check(errors.Join(collect(errs)...), "instances")
	for id, owner := range e.owners() {
		if beliefs[id] != owner {
			e.t.Fatalf("tenant %s owned by %q, but %q believes it owns it", id, owner, beliefs[id])
		}
	}
	e.noneInUse("churn")
}

// testFleetClaimWaitsForRenewal renews a member row in a transaction that
// is still open when the row's previous expiry passes, as a heartbeat
// that began in time and commits late. A claim meanwhile must wait for
// it and then leave the member its tenants: the heartbeat tells the
// member it renewed, so it goes on serving them.
func testFleetClaimWaitsForRenewal(e *fleetEnv) {
	e.migrated()
	e.put("t1", "t2")
	e.beat("a", time.Minute)
	e.beat("b", time.Minute)
	e.wantIDs("a claimed", e.claim("a", 5), []string{"t1", "t2"})
	var tx sqladapters.Tx
	for ttl := 2 * time.Second; ; ttl *= 2 {
		if ttl > time.Minute {
			e.t.Fatal("could not renew within a ttl of a minute")
		}
		if !e.beat("a", ttl) {
			e.t.Fatal("a's heartbeat did not renew")
		}
		var err error
		tx, err = e.db.Begin(e.ctx, sql.TxOptions{})
		e.check(err, "begin")
		renewed, err := e.f.Heartbeat(e.ctx, tx, "a", time.Minute)
		if err == nil && renewed {
			break
		}
		sqladapters.Rollback(tx)
		e.check(err, "Heartbeat in a transaction")
		// The row expired before the renewal reached it: try with more
		// time.
	}
	committed := false
	defer func() {
		if !committed {
			sqladapters.Rollback(tx)
		}
	}()
	for slices.Contains(e.live(), "a") {
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("a's committed row did not expire: %v", e.ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	type result struct {
		ts  []sqladapters.FleetTenant
		err error
	}
	done := make(chan result, 1)
	go func() {
		ts, err := e.f.ClaimTenants(e.ctx, e.db, "b", 5)
		done <- result{ts, err}
	}()
	// Wait until the claim waits for the renewal's lock, or ended.
	var early *result
	for early == nil && e.nobodyWaits(e.f.Tables()[0]) {
		select {
		case r := <-done:
			early = &r
		case <-time.After(20 * time.Millisecond):
		}
	}
	if early != nil && len(early.ts) > 0 {
		e.t.Fatalf("b claimed %q while a's renewal was under way", fleetIDs(early.ts))
	}
	e.check(tx.Commit(e.ctx), "commit the renewal")
	committed = true
	r := early
	if r == nil {
		got := <-done
		r = &got
	}
	e.check(r.err, "ClaimTenants")
	if len(r.ts) > 0 {
		e.t.Fatalf("b claimed %q, which a renewed its lease on", fleetIDs(r.ts))
	}
	e.wantIDs("a owns", e.owned("a"), []string{"t1", "t2"})
	e.noneInUse("claims")
}

// nobodyWaits tells that no statement naming table waits for a lock,
// where the database can tell; where it cannot, false.
func (e *fleetEnv) nobodyWaits(table string) bool {
	e.t.Helper()
	var q string
	switch e.f.Name() {
	case "postgres":
		q = `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, '` + table + `') > 0`
	case "mysql":
		// information_schema.innodb_trx misses some waiting transactions on
		// MariaDB; a statement on table still running is one that waits.
		q = `SELECT count(*) FROM information_schema.processlist
WHERE id <> CONNECTION_ID() AND command IN ('Query', 'Execute') AND LOCATE('` + table + `', info) > 0`
	default:
		return false
	}
	rows, err := e.db.Query(e.ctx, q)
	e.check(err, "look for lock waits")
	defer rows.Close()
	var n int
	for rows.Next() {
		e.check(rows.Scan(&n), "scan")
	}
	e.check(rows.Err(), "look for lock waits")
	return n == 0
}
