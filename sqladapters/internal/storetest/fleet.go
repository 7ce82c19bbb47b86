package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// FleetSetup is the database one run of the fleet suite uses.
type FleetSetup struct {
	// DB is the database the suite runs on.
	DB sqladapters.DB
	// New returns a fleet store whose tables no other test uses, not yet
	// migrated. It removes whatever the test creates in the database
	// after the test (t.Cleanup).
	New func(t *testing.T) sqladapters.FleetStore
	// InUse, when set, counts the connections of DB in use, so that the
	// suite can check that no transaction was left open.
	InUse func() int
}

// RunFleet runs the conformance suite of the fleet's control tables,
// sqladapters.FleetStore: migrations, members, the catalog and its
// version, tenant IDs, and claims, alone and concurrent. The cases run one
// after the other, each on tables of its own.
func RunFleet(t *testing.T, s FleetSetup) {
	t.Helper()
	if s.DB == nil || s.New == nil {
		t.Fatal("storetest: FleetSetup needs DB and New")
	}
	for _, c := range fleetCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			c.run(&fleetEnv{t: t, ctx: ctx, s: s, db: s.DB})
		})
	}
}

var fleetCases = []struct {
	name string
	run  func(*fleetEnv)
}{
	{"Migrate", testFleetMigrate},
	{"MigrateConcurrent", testFleetMigrateConcurrent},
	{"MissingTable", testFleetMissingTable},
	{"MigrationScript", testFleetMigrationScript},
	{"Members", testFleetMembers},
	{"MemberExpires", testFleetMemberExpires},
	{"Leave", testFleetLeave},
	{"Catalog", testFleetCatalog},
	{"CatalogInTx", testFleetCatalogInTx},
	{"PutConcurrent", testFleetPutConcurrent},
	{"TenantIDs", testFleetTenantIDs},
	{"Claims", testFleetClaims},
	{"RemovedNeverClaimed", testFleetRemovedNeverClaimed},
	{"ClaimsConcurrent", testFleetClaimsConcurrent},
	{"ClaimsChurn", testFleetClaimsChurn},
	{"ClaimWaitsForRenewal", testFleetClaimWaitsForRenewal},
}

// fleetEnv is one subtest's view of the database.
type fleetEnv struct {
	t   *testing.T
	ctx context.Context
	s   FleetSetup
	db  sqladapters.DB
	f   sqladapters.FleetStore
}

// migrated gives e a fresh migrated store and returns it.
func (e *fleetEnv) migrated() sqladapters.FleetStore {
	e.t.Helper()
	e.f = e.s.New(e.t)
	if err := sqladapters.MigrateFleet(e.ctx, e.db, e.f); err != nil {
		e.t.Fatalf("MigrateFleet: %v", err)
	}
	return e.f
}

func (e *fleetEnv) check(err error, what string) {
	e.t.Helper()
	if err != nil {
		e.t.Fatalf("%s: %v", what, err)
	}
}

// noneInUse checks that no connection of the DB is in use, when the setup
// can tell.
func (e *fleetEnv) noneInUse(after string) {
	e.t.Helper()
	if e.s.InUse == nil {
		return
	}
	if n := e.s.InUse(); n != 0 {
		e.t.Fatalf("%d connections in use after %s: a transaction was left open", n, after)
	}
}

// beat runs a heartbeat of instance and returns whether it renewed.
func (e *fleetEnv) beat(instance string, ttl time.Duration) bool {
	e.t.Helper()
	renewed, err := e.f.Heartbeat(e.ctx, e.db, instance, ttl)
	e.check(err, "Heartbeat "+instance)
	return renewed
}

func (e *fleetEnv) live() []string {
	e.t.Helper()
	m, err := e.f.LiveMembers(e.ctx, e.db)
	e.check(err, "LiveMembers")
	return m
}

// tenant is a tenant of the suite, on server s1, named after id.
func tenant(id string) sqladapters.FleetTenant {
	return sqladapters.FleetTenant{ID: id, Server: "s1", Database: "db_" + id, Schema: "schema_" + id}
}

func (e *fleetEnv) put(ids ...string) {
	e.t.Helper()
	ts := make([]sqladapters.FleetTenant, len(ids))
	for i, id := range ids {
		ts[i] = tenant(id)
	}
	e.check(e.f.PutTenants(e.ctx, e.db, ts), "PutTenants")
}

func (e *fleetEnv) remove(ids ...string) {
	e.t.Helper()
	e.check(e.f.RemoveTenants(e.ctx, e.db, ids), "RemoveTenants")
}

func (e *fleetEnv) version() int64 {
	e.t.Helper()
	v, err := e.f.CatalogVersion(e.ctx, e.db)
	e.check(err, "CatalogVersion")
	return v
}

func (e *fleetEnv) tenants() []sqladapters.FleetTenant {
	e.t.Helper()
	ts, err := e.f.Tenants(e.ctx, e.db)
	e.check(err, "Tenants")
	return ts
}

// owners returns the live owner of every tenant in the catalog ("" for
// none).
func (e *fleetEnv) owners() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, t := range e.tenants() {
		out[t.ID] = t.Owner
	}
	return out
}

// owned returns the IDs of the tenants instance owns, checking that each
// names it as its owner.
func (e *fleetEnv) owned(instance string) []string {
	e.t.Helper()
	ts, err := e.f.OwnedTenants(e.ctx, e.db, instance)
	e.check(err, "OwnedTenants "+instance)
	for _, t := range ts {
		if t.Owner != instance {
			e.t.Fatalf("OwnedTenants(%q) returned %q with owner %q", instance, t.ID, t.Owner)
		}
	}
	return fleetIDs(ts)
}

// claim claims up to max tenants for instance and returns their IDs,
// checking that they come in order with their owner and locations.
func (e *fleetEnv) claim(instance string, max int) []string {
	e.t.Helper()
	ts, err := e.f.ClaimTenants(e.ctx, e.db, instance, max)
	e.check(err, "ClaimTenants "+instance)
	if len(ts) > max {
		e.t.Fatalf("%s claimed %d tenants, more than %d", instance, len(ts), max)
	}
	for _, t := range ts {
		if t.Owner != instance || t.Removed {
			e.t.Fatalf("%s claimed %+v", instance, t)
		}
	}
	ids := fleetIDs(ts)
	if !slices.IsSorted(ids) {
		e.t.Fatalf("%s claimed %q, not in ID order", instance, ids)
	}
	return ids
}

func (e *fleetEnv) release(instance string, ids ...string) {
	e.t.Helper()
	e.check(e.f.ReleaseTenants(e.ctx, e.db, instance, ids), "ReleaseTenants")
}

func fleetIDs(ts []sqladapters.FleetTenant) []string {
	ids := []string{}
	for _, t := range ts {
		ids = append(ids, t.ID)
	}
	return ids
}

// expire makes the member row of instance, live now, expire soon (a
// renewal with a short ttl), and waits until it has: as the heartbeat of
// an instance that stopped.
func (e *fleetEnv) expire(instance string) {
	e.t.Helper()
	if !e.beat(instance, 200*time.Millisecond) {
		e.t.Fatalf("%s was not live before it expired", instance)
	}
	for slices.Contains(e.live(), instance) {
		select {
		case <-e.ctx.Done():
			e.t.Fatalf("%s still live: %v", instance, e.ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// wantIDs fails unless got equals want.
func (e *fleetEnv) wantIDs(what string, got, want []string) {
	e.t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !slices.Equal(got, want) {
		e.t.Fatalf("%s: %q, want %q", what, got, want)
	}
}

// testFleetMigrate migrates a fresh store twice: the second run finds
// every version applied.
func testFleetMigrate(e *fleetEnv) {
	f := e.s.New(e.t)
	ms := f.Migrations()
	if len(ms) == 0 {
		e.t.Fatal("no migrations")
	}
	if _, err := f.AppliedMigrations(e.ctx, e.db); !errors.Is(err, sqladapters.ErrMissingTable) {
		e.t.Fatalf("AppliedMigrations before migrating: %v, want ErrMissingTable", err)
	}
	for i := range 2 {
		e.check(sqladapters.MigrateFleet(e.ctx, e.db, f), fmt.Sprint("migration run ", i+1))
		applied, err := f.AppliedMigrations(e.ctx, e.db)
		e.check(err, "AppliedMigrations")
		if len(applied) != len(ms) || applied[len(applied)-1] != ms[len(ms)-1].Version {
			e.t.Fatalf("applied versions %v, want those of %d migrations", applied, len(ms))
		}
	}
	e.f = f
	if v := e.version(); v < time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro() {
		e.t.Fatalf("the first catalog version is %d, want the clock's microseconds", v)
	}
	if len(f.Tables()) != 4 {
		e.t.Fatalf("tables %q, want members, tenants, version and migrations", f.Tables())
	}
	e.noneInUse("MigrateFleet")
}

// testFleetMigrateConcurrent migrates one fresh store from ten goroutines
// at once, as the instances of a fleet starting for the first time do.
func testFleetMigrateConcurrent(e *fleetEnv) {
	e.f = e.s.New(e.t)
	errs := make(chan error, 10)
	for range cap(errs) {
		go func() { errs <- sqladapters.MigrateFleet(e.ctx, e.db, e.f) }()
	}
	e.check(errors.Join(collect(errs)...), "concurrent MigrateFleet")
	e.put("a")
	e.beat("i", time.Minute)
	e.wantIDs("claimed", e.claim("i", 5), []string{"a"})
	e.noneInUse("MigrateFleet")
}

// testFleetMissingTable uses a store whose tables were never created:
// every method fails with a *MissingTableError that says how to create
// the fleet's tables.
func testFleetMissingTable(e *fleetEnv) {
	e.f = e.s.New(e.t)
	want := func(op string, err error) {
		e.t.Helper()
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) {
			e.t.Fatalf("%s: want a *MissingTableError, got %v", op, err)
		}
		if !mt.Fleet || mt.Dialect != e.f.Name() {
			e.t.Fatalf("%s: the error names %q (fleet %v), want the fleet's tables on %q", op, mt.Dialect, mt.Fleet, e.f.Name())
		}
		if n := strings.Count(err.Error(), "sqladapters.MigrateFleet("); n != 1 {
			e.t.Fatalf("%s: the error says %d times how to migrate: %v", op, n, err)
		}
		if again := e.f.ClassifyError(err); again != err {
			e.t.Fatalf("%s: classifying the error again changed it to %v", op, again)
		}
	}
	ctx, db, f := e.ctx, e.db, e.f
	_, err := f.Heartbeat(ctx, db, "i", time.Minute)
	want("Heartbeat", err)
	_, err = f.LiveMembers(ctx, db)
	want("LiveMembers", err)
	want("Leave", f.Leave(ctx, db, "i"))
	want("PutTenants", f.PutTenants(ctx, db, []sqladapters.FleetTenant{tenant("a")}))
	want("RemoveTenants", f.RemoveTenants(ctx, db, []string{"a"}))
	_, err = f.CatalogVersion(ctx, db)
	want("CatalogVersion", err)
	_, err = f.Tenants(ctx, db)
	want("Tenants", err)
	_, err = f.OwnedTenants(ctx, db, "i")
	want("OwnedTenants", err)
	_, err = f.ClaimTenants(ctx, db, "i", 1)
	want("ClaimTenants", err)
	want("ReleaseTenants", f.ReleaseTenants(ctx, db, "i", []string{"a"}))
	_, err = f.DeleteRemoved(ctx, db, "i", []string{"a"})
	want("DeleteRemoved", err)
	_, err = f.AppliedMigrations(ctx, db)
	want("AppliedMigrations", err)
	e.noneInUse("failed calls")
}

// testFleetMigrationScript checks the script for migration tools: it
// names the database and tables, holds every statement in order, and
// applied statement by statement it makes a working store, which
// MigrateFleet then adopts.
func testFleetMigrationScript(e *fleetEnv) {
	f := e.s.New(e.t)
	script := f.MigrationScript()
	head := strings.SplitN(script, "\n", 2)[0]
	if !strings.HasPrefix(head, "-- millbox fleet control tables for "+f.Name()) || !strings.Contains(head, f.Tables()[0]) {
		e.t.Fatalf("the script does not start naming the database and the tables:\n%.300s", script)
	}
	at := 0
	for _, m := range f.Migrations() {
		for _, stmt := range m.Statements {
			i := strings.Index(script[at:], strings.TrimSpace(stmt))
			if i < 0 {
				e.t.Fatalf("the script lacks, after byte %d, a statement of version %d:\n%s", at, m.Version, stmt)
			}
			at += i + len(strings.TrimSpace(stmt))
		}
	}
	for _, stmt := range strings.Split(script, ";\n") {
		var lines []string
		for _, l := range strings.Split(stmt, "\n") {
			if !strings.HasPrefix(l, "--") {
				lines = append(lines, l)
			}
		}
		if stmt := strings.TrimSpace(strings.Join(lines, "\n")); stmt != "" {
			_, err := e.db.Exec(e.ctx, stmt)
			e.check(err, "the script's statement "+stmt)
		}
	}
	e.f = f
	v := e.version()
	e.put("a")
	if e.version() == v {
		e.t.Fatal("the catalog version did not move on tables the script made")
	}
	e.check(sqladapters.MigrateFleet(e.ctx, e.db, f), "MigrateFleet after the script")
	e.wantIDs("tenants", fleetIDs(e.tenants()), []string{"a"})
}

// testFleetMembers lists live members in byte order: a heartbeat adds or
// renews one, Leave removes one, and bad names and ttls are refused.
func testFleetMembers(e *fleetEnv) {
	e.migrated()
	long := strings.Repeat("i", sqladapters.MaxFleetNameBytes)
	names := []string{"b", "B", "a", "a ", "é", "e\u0301", "日本", "x'\"\\%_", long}
	for _, n := range names {
		if e.beat(n, time.Minute) {
			e.t.Fatalf("the first heartbeat of %q renewed", n)
		}
	}
	for _, n := range names {
		if !e.beat(n, time.Minute) {
			e.t.Fatalf("the second heartbeat of %q did not renew", n)
		}
	}
	want := slices.Sorted(slices.Values(names))
	e.wantIDs("live members", e.live(), want)
	e.check(e.f.Leave(e.ctx, e.db, "a"), "Leave")
	e.check(e.f.Leave(e.ctx, e.db, "unknown"), "Leave of a stranger")
	e.wantIDs("live members after a left", e.live(), slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "a" }))
	if e.beat("a", time.Minute) {
		e.t.Fatal("the heartbeat of an instance that left renewed")
	}
	for _, bad := range []string{"", long + "i", "nul\x00", "bad \xff utf-8"} {
		if _, err := e.f.Heartbeat(e.ctx, e.db, bad, time.Minute); !errors.Is(err, sqladapters.ErrInvalidConfig) {
			e.t.Fatalf("Heartbeat(%.20q): %v, want ErrInvalidConfig", bad, err)
		}
		if _, err := e.f.ClaimTenants(e.ctx, e.db, bad, 1); !errors.Is(err, sqladapters.ErrInvalidConfig) {
			e.t.Fatalf("ClaimTenants(%.20q): %v, want ErrInvalidConfig", bad, err)
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, time.Microsecond} {
		if _, err := e.f.Heartbeat(e.ctx, e.db, "a", ttl); err == nil || !strings.Contains(err.Error(), "ttl") {
			e.t.Fatalf("Heartbeat with ttl %v: %v, want an error naming the ttl", ttl, err)
		}
	}
	e.noneInUse("members")
}

// testFleetMemberExpires checks that the tenants of an instance that
// stopped renewing are its own until its row expires, and claimable
// after; its next heartbeat starts afresh, owning nothing.
func testFleetMemberExpires(e *fleetEnv) {
	e.migrated()
	e.put("t1", "t2", "t3")
	e.beat("a", time.Minute)
	e.beat("b", time.Minute)
	e.wantIDs("a claimed", e.claim("a", 5), []string{"t1", "t2", "t3"})
	e.wantIDs("b claimed while a is live", e.claim("b", 5), nil)
	e.expire("a")
	for id, owner := range e.owners() {
		if owner != "" {
			e.t.Fatalf("tenant %s has live owner %q after a expired", id, owner)
		}
	}
	e.wantIDs("a owns after it expired", e.owned("a"), nil)
	e.wantIDs("b claimed after a expired", e.claim("b", 5), []string{"t1", "t2", "t3"})
	if e.beat("a", time.Minute) {
		e.t.Fatal("the heartbeat of an expired instance renewed")
	}
	e.wantIDs("a owns after it came back", e.owned("a"), nil)
	e.wantIDs("b owns", e.owned("b"), []string{"t1", "t2", "t3"})

	// An instance that comes back before anyone claimed its tenants owns
	// none of them either: a claim may have been under way.
	e.beat("c", time.Minute)
	e.put("t4")
	e.wantIDs("c claimed", e.claim("c", 5), []string{"t4"})
	e.expire("c")
	if e.beat("c", time.Minute) {
		e.t.Fatal("the heartbeat of an expired instance renewed")
	}
	e.wantIDs("c owns after it came back", e.owned("c"), nil)
	if o := e.owners()["t4"]; o != "" {
		e.t.Fatalf("t4 owned by %q, want released", o)
	}
	e.wantIDs("c claimed again", e.claim("c", 5), []string{"t4"})
	e.noneInUse("expiry")
}

// testFleetLeave checks that an instance that leaves frees its tenants at
// once and deletes the removed ones it held.
func testFleetLeave(e *fleetEnv) {
	e.migrated()
	e.put("t1", "t2", "t3")
	e.beat("a", time.Minute)
	e.beat("b", time.Minute)
	e.wantIDs("a claimed", e.claim("a", 2), []string{"t1", "t2"})
	v := e.version()
	e.check(e.f.Leave(e.ctx, e.db, "b"), "Leave of an instance without tenants")
	if e.version() != v {
		e.t.Fatal("the catalog version moved when an instance without removed tenants left")
	}
	e.beat("b", time.Minute)
	e.remove("t1")
	v = e.version()
	e.check(e.f.Leave(e.ctx, e.db, "a"), "Leave")
	if e.version() == v {
		e.t.Fatal("the catalog version did not move when leaving deleted a removed tenant")
	}
	e.wantIDs("live members", e.live(), []string{"b"})
	e.wantIDs("catalog", fleetIDs(e.tenants()), []string{"t2", "t3"})
	e.wantIDs("b claimed", e.claim("b", 5), []string{"t2", "t3"})
	e.noneInUse("Leave")
}

// testFleetCatalog checks puts, removals and deletions, and that the
// catalog version moves with each change and with nothing else.
func testFleetCatalog(e *fleetEnv) {
	e.migrated()
	v := e.version()
	moved := func(what string, want bool) {
		e.t.Helper()
		now := e.version()
		if (now != v) != want {
			e.t.Fatalf("%s: the catalog version went from %d to %d; want it moved: %v", what, v, now, want)
		}
		v = now
	}
	e.put("a", "b")
	moved("put of two new tenants", true)
	if got := e.tenants(); !slices.Equal(got, []sqladapters.FleetTenant{tenant("a"), tenant("b")}) {
		e.t.Fatalf("catalog %+v", got)
	}
	e.put("b", "a")
	moved("put of the same tenants", false)
	e.check(e.f.PutTenants(e.ctx, e.db, nil), "PutTenants of none")
	moved("put of none", false)
	changed := tenant("a")
	changed.Schema = "other"
	e.check(e.f.PutTenants(e.ctx, e.db, []sqladapters.FleetTenant{changed, tenant("b")}), "PutTenants")
	moved("put of a changed tenant", true)
	if got := e.tenants(); got[0] != changed {
		e.t.Fatalf("tenant a is %+v after the put, want %+v", got[0], changed)
	}
	e.remove("x")
	e.remove()
	moved("removal of a tenant not in the catalog", false)

	e.beat("i", time.Minute)
	e.beat("j", time.Minute)
	e.wantIDs("i claimed", e.claim("i", 1), []string{"a"})
	e.release("i", "b")
	e.wantIDs("j claimed", e.claim("j", 1), []string{"b"})
	e.release("j", "b")
	e.beat("i", time.Minute)
	e.beat("k", time.Minute)
	moved("heartbeats, claims and releases", false)

	e.remove("a", "b")
	moved("removal", true)
	got := e.tenants()
	if len(got) != 1 || got[0].ID != "a" || !got[0].Removed || got[0].Owner != "i" {
		t := got
		e.t.Fatalf("catalog after removing a (owned by i) and b (owned by nobody): %+v, want a removed and owned, b deleted", t)
	}
	owned, err := e.f.OwnedTenants(e.ctx, e.db, "i")
	e.check(err, "OwnedTenants")
	if len(owned) != 1 || !owned[0].Removed {
		e.t.Fatalf("i owns %+v, want a, removed", owned)
	}
	e.remove("a")
	moved("removal of a removed tenant", false)
	e.put("a")
	moved("put of a removed tenant", true)
	got = e.tenants()
	if len(got) != 1 || got[0].Removed || got[0].Owner != "i" {
		e.t.Fatalf("catalog after a came back: %+v, want a, not removed, still i's", got)
	}
	e.remove("a")
	moved("removal", true)
	del := func(instance string, want int64, ids ...string) {
		e.t.Helper()
		n, err := e.f.DeleteRemoved(e.ctx, e.db, instance, ids)
		e.check(err, "DeleteRemoved")
		if n != want {
			e.t.Fatalf("DeleteRemoved(%s, %q) deleted %d, want %d", instance, ids, n, want)
		}
	}
	del("j", 0, "a")
	moved("deletion by an instance that does not own the tenant", false)
	e.put("c")
	e.wantIDs("j claimed", e.claim("j", 5), []string{"c"})
	v = e.version()
	del("j", 0, "c")
	moved("deletion of a tenant that is not removed", false)
	del("i", 1, "a", "zzz")
	moved("deletion", true)
	del("i", 0)
	e.wantIDs("catalog", fleetIDs(e.tenants()), []string{"c"})

	for name, ts := range map[string][]sqladapters.FleetTenant{
		"an ID given twice": {tenant("d"), tenant("d")},
		"Removed set":       {{ID: "d", Removed: true}},
		"Owner set":         {{ID: "d", Owner: "i"}},
		"an empty ID":       {{Server: "s"}},
	} {
		if err := e.f.PutTenants(e.ctx, e.db, ts); !errors.Is(err, sqladapters.ErrInvalidTenant) {
			e.t.Fatalf("PutTenants with %s: %v, want ErrInvalidTenant", name, err)
		}
	}
	moved("refused puts", false)
	e.noneInUse("catalog")
}

// testFleetCatalogInTx writes the catalog in the caller's transaction: a
// rollback leaves nothing, a commit everything.
func testFleetCatalogInTx(e *fleetEnv) {
	e.migrated()
	v := e.version()
	for _, commit := range []bool{false, true} {
		tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
		e.check(err, "begin")
		if err := e.f.PutTenants(e.ctx, tx, []sqladapters.FleetTenant{tenant("a"), tenant("b")}); err != nil {
			sqladapters.Rollback(tx)
			e.t.Fatalf("PutTenants in a transaction: %v", err)
		}
		if err := e.f.RemoveTenants(e.ctx, tx, []string{"b"}); err != nil {
			sqladapters.Rollback(tx)
			e.t.Fatalf("RemoveTenants in a transaction: %v", err)
		}
		if !commit {
			e.check(tx.Rollback(e.ctx), "rollback")
			if ts := e.tenants(); len(ts) != 0 || e.version() != v {
				e.t.Fatalf("after a rollback: catalog %+v, version %d (was %d)", ts, e.version(), v)
			}
			continue
		}
		e.check(tx.Commit(e.ctx), "commit")
	}
	e.wantIDs("catalog after the commit", fleetIDs(e.tenants()), []string{"a"})
	if e.version() == v {
		e.t.Fatal("the catalog version did not move with the commit")
	}
	e.noneInUse("transactions")
}

// testFleetPutConcurrent puts overlapping sets of new tenants from
// several goroutines at once, as the instances of an application
// registering tenants do: every put succeeds and the catalog holds them
// all.
func testFleetPutConcurrent(e *fleetEnv) {
	e.migrated()
	const writers, each = 6, 40
	v := e.version()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			var ts []sqladapters.FleetTenant
			for i := range each {
				ts = append(ts, tenant(fmt.Sprintf("t%03d", w*each/2+i)))
			}
			errs <- e.f.PutTenants(e.ctx, e.db, ts)
		}()
	}
	e.check(errors.Join(collect(errs)...), "concurrent PutTenants")
	if n, want := len(e.tenants()), (writers+1)*each/2; n != want {
		e.t.Fatalf("%d tenants after the puts, want %d", n, want)
	}
	if e.version() == v {
		e.t.Fatal("the catalog version did not move")
	}
	e.noneInUse("puts")
}

// testFleetTenantIDs stores tenant IDs, names and paths of any UTF-8 up to
// their limits byte for byte, as distinct as their bytes, and refuses
// what the catalog cannot hold with an error naming it.
func testFleetTenantIDs(e *fleetEnv) {
	e.migrated()
	ids := []string{
		"a", "A", "a ", " a", "é", "e\u0301", "日本語", "emoji 😀", `quote ' " \ % _`, "tab\tnew\nline",
		strings.Repeat("x", sqladapters.MaxFleetNameBytes), strings.Repeat("é", sqladapters.MaxFleetNameBytes/2),
		"a,b", "{a}", "NULL", "$1", "?",
	}
	var ts []sqladapters.FleetTenant
	for i, id := range ids {
		ts = append(ts, sqladapters.FleetTenant{
			ID: id, Server: fmt.Sprintf("server %d é'", i), Database: "db \"" + id, Schema: "",
		})
	}
	ts[0].Database = strings.Repeat("/path", sqladapters.MaxFleetPathBytes/5)
	ts[1].Schema = strings.Repeat("s", sqladapters.MaxFleetPathBytes)
	ts[2].Server = strings.Repeat("ß", sqladapters.MaxFleetNameBytes/2)
	e.check(e.f.PutTenants(e.ctx, e.db, ts), "PutTenants")
	want := slices.SortedFunc(slices.Values(ts), func(a, b sqladapters.FleetTenant) int { return strings.Compare(a.ID, b.ID) })
	if got := e.tenants(); !slices.Equal(got, want) {
		e.t.Fatalf("catalog read back:\n%#v\nwant\n%#v", got, want)
	}
	v := e.version()
	e.check(e.f.PutTenants(e.ctx, e.db, ts), "PutTenants again")
	if e.version() != v {
		e.t.Fatal("putting the same tenants again moved the catalog version")
	}
	e.beat("i", time.Minute)
	got, err := e.f.ClaimTenants(e.ctx, e.db, "i", len(ids))
	e.check(err, "ClaimTenants")
	for i := range want {
		want[i].Owner = "i"
	}
	if !slices.Equal(got, want) {
		e.t.Fatalf("claimed:\n%#v\nwant\n%#v", got, want)
	}
	e.release("i", fleetIDs(want[:3])...)
	e.wantIDs("owned after releasing three", e.owned("i"), fleetIDs(want[3:]))

	long := strings.Repeat("x", sqladapters.MaxFleetNameBytes+1)
	for name, c := range map[string]struct {
		t     sqladapters.FleetTenant
		words string
	}{
		"long ID":         {sqladapters.FleetTenant{ID: long}, "201 bytes"},
		"NUL in ID":       {sqladapters.FleetTenant{ID: "a\x00b"}, "NUL"},
		"bad UTF-8 ID":    {sqladapters.FleetTenant{ID: "a\xffb"}, "UTF-8"},
		"empty ID":        {sqladapters.FleetTenant{}, "empty"},
		"long server":     {sqladapters.FleetTenant{ID: "t", Server: long}, "Server"},
		"long database":   {sqladapters.FleetTenant{ID: "t", Database: strings.Repeat("d", sqladapters.MaxFleetPathBytes+1)}, "Database"},
		"NUL in schema":   {sqladapters.FleetTenant{ID: "t", Schema: "s\x00"}, "Schema"},
		"bad UTF-8 sever": {sqladapters.FleetTenant{ID: "t", Server: "\xc3"}, "Server"},
	} {
		err := e.f.PutTenants(e.ctx, e.db, []sqladapters.FleetTenant{c.t})
		if !errors.Is(err, sqladapters.ErrInvalidTenant) || !strings.Contains(err.Error(), c.words) {
			e.t.Fatalf("PutTenants with a %s: %v, want ErrInvalidTenant saying %q", name, err, c.words)
		}
	}
	for _, bad := range []string{long, "a\x00", "\xff", ""} {
		for op, err := range map[string]error{
			"RemoveTenants":  e.f.RemoveTenants(e.ctx, e.db, []string{"a", bad}),
			"ReleaseTenants": e.f.ReleaseTenants(e.ctx, e.db, "i", []string{bad}),
		} {
			if !errors.Is(err, sqladapters.ErrInvalidTenant) {
				e.t.Fatalf("%s with ID %.20q: %v, want ErrInvalidTenant", op, bad, err)
			}
		}
		if _, err := e.f.DeleteRemoved(e.ctx, e.db, "i", []string{bad}); !errors.Is(err, sqladapters.ErrInvalidTenant) {
			e.t.Fatalf("DeleteRemoved with ID %.20q: %v, want ErrInvalidTenant", bad, err)
		}
	}
	if got := e.tenants(); len(got) != len(ids) || e.version() != v {
		e.t.Fatalf("refused calls changed the catalog: %d tenants, version %d (was %d)", len(got), e.version(), v)
	}
	e.noneInUse("tenant IDs")
}
