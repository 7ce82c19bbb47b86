package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/millbox/millbox/sqladapters"
)

// fleetMigration is what migrate up --fleet did to one tenant.
type fleetMigration struct {
	sqladapters.FleetTenant
	// Action is "created", "upgraded" or "up to date"; empty on failure.
	Action   string
	From, To int // versions before and after; From is 0 for created
	Error    string
}

// migrateFleet creates or upgrades the millbox tables of every tenant:
// those of the catalog, whose control tables it creates or upgrades
// first, or those of a tenants file, without touching the control
// database. It visits --parallel tenants at once, reports each as it
// finishes, and fails when any tenant failed.
func migrateFleet(ctx context.Context, e env, c *common, f *fleetFlags, tenantsFile string, asJSON bool) error {
	servers, err := f.serverDSNs(e)
	if err != nil {
		return err
	}
	var tenants []sqladapters.FleetTenant
	if tenantsFile != "" {
		if tenants, err = readTenantsFile(tenantsFile); err != nil {
			return usageError{err.Error()}
		}
	} else {
		if tenants, err = migrateControl(ctx, e, c, f, asJSON); err != nil {
			return err
		}
	}
	dbs := newTenantDBs(c, servers)
	defer dbs.close()
	var mu sync.Mutex // serializes the lines of tenants finishing at once
	results := make([]fleetMigration, len(tenants))
	forEach(tenants, f.parallel, func(i int, t sqladapters.FleetTenant) {
		r := migrateTenant(ctx, dbs, t)
		results[i] = r
		if asJSON {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if r.Error != "" {
			fmt.Fprintf(e.stdout, "error  %s: %s\n", oneLine(t.ID, 60), oneLine(r.Error, 300))
			return
		}
		fmt.Fprintf(e.stdout, "ok     %s: %s\n", oneLine(t.ID, 60), r.describe())
	})
	failed := 0
	for _, r := range results {
		if r.Error != "" {
			failed++
		}
	}
	if asJSON {
		if err := writeJSON(e, fleetMigrationJSON(results, failed)); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(e.stdout, "migrated %d of %s", len(tenants)-failed, count(int64(len(tenants)), "tenant"))
		if failed > 0 {
			fmt.Fprintf(e.stdout, "; %d failed", failed)
		}
		fmt.Fprintln(e.stdout)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %s failed to migrate", failed, count(int64(len(tenants)), "tenant"))
	}
	return nil
}

// migrateControl creates or upgrades the fleet's control tables, says
// so, and returns the catalog.
func migrateControl(ctx context.Context, e env, c *common, f *fleetFlags, asJSON bool) ([]sqladapters.FleetTenant, error) {
	ctl, err := f.openControl(ctx, e, c)
	if err != nil {
		return nil, err
	}
	defer ctl.close()
	before, err := ctl.store.AppliedMigrations(ctx, ctl.db)
	if err != nil && !errors.Is(err, sqladapters.ErrMissingTable) {
		return nil, fmt.Errorf("read the control tables' applied migrations: %w", err)
	}
	if err := sqladapters.MigrateFleet(ctx, ctl.db, ctl.store); err != nil {
		return nil, fmt.Errorf("migrate the fleet's control tables: %w", err)
	}
	after, err := ctl.store.AppliedMigrations(ctx, ctl.db)
	if err != nil {
		return nil, fmt.Errorf("read the control tables' applied migrations: %w", err)
	}
	if !asJSON {
		from, to := 0, 0
		if len(before) > 0 {
			from = slices.Max(before)
		}
		if len(after) > 0 {
			to = slices.Max(after)
		}
		fmt.Fprintf(e.stdout, "fleet %s: %s\n", ctl.tables(), describeMigration(from, to, len(before) == 0))
	}
	tenants, err := ctl.store.Tenants(ctx, ctl.db)
	if err != nil {
		return nil, ctl.explain(err, c)
	}
	return tenants, nil
}

// migrateTenant creates or upgrades one tenant's tables.
func migrateTenant(ctx context.Context, dbs *tenantDBs, t sqladapters.FleetTenant) fleetMigration {
	r := fleetMigration{FleetTenant: t}
	fail := func(err error) fleetMigration {
		r.Error = dbs.redact(err)
		return r
	}
	db, d, err := dbs.open(ctx, t)
	if err != nil {
		return fail(err)
	}
	before, err := d.AppliedMigrations(ctx, db)
	if err != nil && !errors.Is(err, sqladapters.ErrMissingTable) {
		return fail(fmt.Errorf("read the applied migrations: %w", err))
	}
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		return fail(err)
	}
	after, err := d.AppliedMigrations(ctx, db)
	if err != nil {
		return fail(fmt.Errorf("read the applied migrations: %w", err))
	}
	if len(before) > 0 {
		r.From = slices.Max(before)
	}
	if len(after) > 0 {
		r.To = slices.Max(after)
	}
	switch {
	case len(before) == 0:
		r.Action = "created"
	case r.From == r.To:
		r.Action = "up to date"
	default:
		r.Action = "upgraded"
	}
	return r
}

func (r fleetMigration) describe() string {
	return describeMigration(r.From, r.To, r.Action == "created")
}

func describeMigration(from, to int, created bool) string {
	switch {
	case created:
		return fmt.Sprintf("created (version %d)", to)
	case from == to:
		return fmt.Sprintf("up to date (version %d)", to)
	}
	return fmt.Sprintf("upgraded from version %d to %d", from, to)
}

// jsonFleetMigrate is the --json form of migrate up --fleet.
type jsonFleetMigrate struct {
	Tenants []jsonTenantMigration `json:"tenants"`
	OK      int                   `json:"ok"`
	Failed  int                   `json:"failed"`
}

type jsonTenantMigration struct {
	ID       string `json:"id"`
	Server   string `json:"server"`
	Database string `json:"database"`
	Schema   string `json:"schema"`
	OK       bool   `json:"ok"`
	Action   string `json:"action,omitempty"`
	Version  int    `json:"version,omitempty"`
	Error    string `json:"error,omitempty"`
}

func fleetMigrationJSON(results []fleetMigration, failed int) jsonFleetMigrate {
	j := jsonFleetMigrate{Tenants: make([]jsonTenantMigration, len(results)), OK: len(results) - failed, Failed: failed}
	for i, r := range results {
		j.Tenants[i] = jsonTenantMigration{ID: r.ID, Server: r.Server, Database: r.Database, Schema: r.Schema,
			OK: r.Error == "", Action: r.Action, Version: r.To, Error: r.Error}
	}
	return j
}
