package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// fleetTenantStatus is one tenant of the catalog with its backlog, read
// from its own outbox.
type fleetTenantStatus struct {
	sqladapters.FleetTenant
	sqladapters.OutboxStats
	// Down tells that the tenant's outbox could not be read; Error says
	// why.
	Down  bool
	Error string
}

// fleetStatus is the fleet as the control database and the tenants'
// outboxes show it.
type fleetStatus struct {
	Members []string // live instances, in byte order
	Tenants []fleetTenantStatus
}

// statusFleet reads the catalog and the live members from the control
// database, then every tenant's outbox, at most --parallel at once. A
// tenant that cannot be read is reported down; only the control database
// failing fails the command.
func statusFleet(ctx context.Context, e env, c *common, f *fleetFlags, asJSON bool) error {
	servers, err := f.serverDSNs(e)
	if err != nil {
		return err
	}
	ctl, err := f.openControl(ctx, e, c)
	if err != nil {
		return err
	}
	defer ctl.close()
	tenants, err := ctl.store.Tenants(ctx, ctl.db)
	if err != nil {
		return ctl.explain(err, c)
	}
	members, err := ctl.store.LiveMembers(ctx, ctl.db)
	if err != nil {
		return ctl.explain(err, c)
	}
	dbs := newTenantDBs(c, servers)
	defer dbs.close()
	st := fleetStatus{Members: members, Tenants: make([]fleetTenantStatus, len(tenants))}
	forEach(tenants, f.parallel, func(i int, t sqladapters.FleetTenant) {
		ts := fleetTenantStatus{FleetTenant: t}
		stats, err := readTenant(ctx, c, dbs, t)
		if err != nil {
			ts.Down, ts.Error = true, dbs.redact(err)
		} else {
			ts.OutboxStats = stats
		}
		st.Tenants[i] = ts
	})
	// The largest backlog first, then the oldest pending message; the
	// tenants that are down, whose backlog is unknown, after them.
	slices.SortFunc(st.Tenants, func(a, b fleetTenantStatus) int {
		return cmp.Or(compareBool(a.Down, b.Down), cmp.Compare(b.Pending, a.Pending),
			cmp.Compare(b.OldestPendingAge, a.OldestPendingAge), cmp.Compare(a.ID, b.ID))
	})
	if asJSON {
		return writeJSON(e, fleetStatusJSON(st))
	}
	printFleetStatus(e, ctl, st)
	return nil
}

// readTenant reads one tenant's backlog within the connect timeout plus
// the statement's own time, so that one hanging server delays the
// command by a bounded time.
func readTenant(ctx context.Context, c *common, dbs *tenantDBs, t sqladapters.FleetTenant) (sqladapters.OutboxStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*c.timeout)
	defer cancel()
	db, d, err := dbs.open(ctx, t)
	if err != nil {
		return sqladapters.OutboxStats{}, err
	}
	stats, err := d.OutboxStats(ctx, db)
	if err != nil {
		return sqladapters.OutboxStats{}, tenantError(c, d, err)
	}
	return stats, nil
}

// tenantError says where a tenant's tables were looked for when they are
// missing.
func tenantError(c *common, d sqladapters.Dialect, err error) error {
	var mt *sqladapters.MissingTableError
	if errors.As(err, &mt) {
		return fmt.Errorf("the millbox tables are missing (looked for %s); create them with: %s", unquote(d.OutboxTable()), c.fleetHint("migrate up --fleet"))
	}
	return err
}

func compareBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// totals add up the tenants.
type fleetTotals struct {
	Tenants, Instances, Unowned, Down int
	Pending, Dead                     int64
	OldestPendingAge                  time.Duration
}

func (st fleetStatus) totals() fleetTotals {
	tot := fleetTotals{Tenants: len(st.Tenants), Instances: len(st.Members)}
	for _, t := range st.Tenants {
		if t.Owner == "" {
			tot.Unowned++
		}
		if t.Down {
			tot.Down++
		}
		tot.Pending += t.Pending
		tot.Dead += t.OutboxStats.Dead
		tot.OldestPendingAge = max(tot.OldestPendingAge, t.OldestPendingAge)
	}
	return tot
}

// held counts the tenants each live instance holds, in the members'
// order; instances holding none are listed too.
func (st fleetStatus) held() []jsonFleetInstance {
	out := make([]jsonFleetInstance, len(st.Members))
	for i, m := range st.Members {
		out[i].Instance = m
		for _, t := range st.Tenants {
			if t.Owner == m {
				out[i].Tenants++
			}
		}
	}
	return out
}

// jsonFleetStatus is the --json form of status --fleet.
type jsonFleetStatus struct {
	Instances []jsonFleetInstance `json:"instances"`
	Tenants   []jsonFleetTenant   `json:"tenants"`
	Totals    jsonFleetTotals     `json:"totals"`
}

type jsonFleetInstance struct {
	Instance string `json:"instance"`
	Tenants  int    `json:"tenants"`
}

type jsonFleetTenant struct {
	ID                      string     `json:"id"`
	Server                  string     `json:"server"`
	Database                string     `json:"database"`
	Schema                  string     `json:"schema"`
	Instance                string     `json:"instance"`
	Removed                 bool       `json:"removed"`
	Down                    bool       `json:"down"`
	Error                   string     `json:"error,omitempty"`
	Pending                 int64      `json:"pending"`
	OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
	Scheduled               int64      `json:"scheduled"`
	NextDue                 *time.Time `json:"next_due,omitempty"`
	DeadLetters             int64      `json:"dead_letters"`
	HeldKeys                int64      `json:"held_keys"`
}

type jsonFleetTotals struct {
	Tenants                 int     `json:"tenants"`
	Instances               int     `json:"instances"`
	Unowned                 int     `json:"unowned"`
	Down                    int     `json:"down"`
	Pending                 int64   `json:"pending"`
	DeadLetters             int64   `json:"dead_letters"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
}

func fleetStatusJSON(st fleetStatus) jsonFleetStatus {
	tot := st.totals()
	j := jsonFleetStatus{
		Instances: st.held(),
		Tenants:   make([]jsonFleetTenant, len(st.Tenants)),
		Totals: jsonFleetTotals{tot.Tenants, tot.Instances, tot.Unowned, tot.Down, tot.Pending, tot.Dead,
			tot.OldestPendingAge.Seconds()},
	}
	for i, t := range st.Tenants {
		j.Tenants[i] = jsonFleetTenant{
			ID: t.ID, Server: t.Server, Database: t.Database, Schema: t.Schema, Instance: t.Owner,
			Removed: t.Removed, Down: t.Down, Error: t.Error,
			Pending: t.Pending, OldestPendingAgeSeconds: t.OldestPendingAge.Seconds(),
			Scheduled: t.Scheduled, NextDue: timeOrNil(t.NextDue), DeadLetters: t.OutboxStats.Dead, HeldKeys: t.HeldKeys,
		}
	}
	return j
}

func printFleetStatus(e env, ctl *control, st fleetStatus) {
	tot := st.totals()
	fmt.Fprintf(e.stdout, "Fleet of the %s: %s, %s live", ctl.tables(), count(int64(tot.Tenants), "tenant"), count(int64(tot.Instances), "instance"))
	if tot.Unowned > 0 {
		fmt.Fprintf(e.stdout, ", %d held by none", tot.Unowned)
	}
	if tot.Down > 0 {
		fmt.Fprintf(e.stdout, ", %d down", tot.Down)
	}
	fmt.Fprintln(e.stdout)
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "TENANT\tINSTANCE\tSERVER\tDATABASE\tSCHEMA\tPENDING\tOLDEST PENDING\tSCHEDULED\tDEAD\tSTATE")
	for _, t := range st.Tenants {
		state := "ok"
		pending, oldest, scheduled, dead := fmt.Sprint(t.Pending), age(t.OldestPendingAge), fmt.Sprint(t.Scheduled), fmt.Sprint(t.OutboxStats.Dead)
		switch {
		case t.Down:
			// Its outbox could not be read: its backlog is unknown, not
			// empty.
			state, pending, oldest, scheduled, dead = "down", "?", "?", "?", "?"
		case t.Removed:
			state = "removed"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", oneLine(t.ID, 40), orDash(oneLine(t.Owner, 40)), oneLine(t.Server, 30),
			orDash(oneLine(t.Database, 40)), orDash(oneLine(t.Schema, 40)), pending, oldest, scheduled, dead, state)
	}
	fmt.Fprintf(w, "(all)\t\t\t\t\t%d\t%s\t\t%d\t\n", tot.Pending, age(tot.OldestPendingAge), tot.Dead)
	w.Flush()
	if len(st.Members) > 0 {
		fmt.Fprintln(e.stdout)
		fmt.Fprintln(w, "INSTANCE\tTENANTS")
		for _, h := range st.held() {
			fmt.Fprintf(w, "%s\t%d\n", oneLine(h.Instance, 60), h.Tenants)
		}
		w.Flush()
	}
	if tot.Down > 0 {
		fmt.Fprintln(e.stdout, "\nDown:")
		for _, t := range st.Tenants {
			if t.Down {
				fmt.Fprintf(e.stdout, "  %s (server %s): %s\n", oneLine(t.ID, 60), oneLine(t.Server, 40), oneLine(t.Error, 300))
			}
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
