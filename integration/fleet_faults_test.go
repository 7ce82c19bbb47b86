package integration_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/mysqlfleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The fleet when things go wrong or get crowded: a tenant that cannot be
// reached, instances killed or frozen, tenants on PostgreSQL and MariaDB
// in one fleet, and the connection budget as the servers see it.

// tenantDatabase makes a tenant of server that is a database of the test
// PostgreSQL of its own, dropped after the test. With migrate false the
// database is created without the millbox tables; see createDatabase for
// one that does not exist yet.
func (e *fleetEnv) tenantDatabase(server string, migrate bool) fleet.Tenant {
	e.t.Helper()
	tn := e.missingDatabase(server)
	e.createDatabase(tn, migrate)
	return tn
}

// missingDatabase makes a tenant of server whose database does not exist
// until createDatabase creates it; it is dropped after the test if it
// does.
func (e *fleetEnv) missingDatabase(server string) fleet.Tenant {
	name := testenv.UniqueName("fleet_")
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.pool.Exec(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
			e.t.Logf("drop database %s: %v", name, err)
		}
	})
	return fleet.Tenant{ID: "t-" + name, Server: server, Database: name}
}

// createDatabase creates tenant tn's database, with the millbox tables
// when migrate is set, and lets the test write into it. The test's
// writes flush the session's statistics with the commit, so that the
// stat doorbell sees each at once rather than up to ten seconds later.
func (e *fleetEnv) createDatabase(tn fleet.Tenant, migrate bool) {
	e.t.Helper()
	ctx := testenv.Ctx(e.t, time.Minute)
	if _, err := e.pool.Exec(ctx, `CREATE DATABASE "`+tn.Database+`"`); err != nil {
		e.t.Fatalf("create database: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	if err != nil {
		e.t.Fatal(err)
	}
	cfg.ConnConfig.Database = tn.Database
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	// Registered after the database's drop, so run before it: the drop
	// does not have to end the test's own sessions.
	e.t.Cleanup(pool.Close)
	d := postgres.MustNew(postgres.Options{WithoutInbox: true, FlushStats: true})
	if migrate {
		e.migrate(tn, pgxv5.WrapPool(pool), d)
	}
	e.writer(tn, pgxv5.WrapPool(pool), d)
}

func (e *fleetEnv) migrate(tn fleet.Tenant, db sqladapters.DB, d sqladapters.Dialect) {
	e.t.Helper()
	if err := sqladapters.Migrate(testenv.Ctx(e.t, time.Minute), db, d); err != nil {
		e.t.Fatalf("migrate tenant %s: %v", tn.ID, err)
	}
}

// mysqlServer adds a MySQL/MariaDB server reached by dsn.
func (e *fleetEnv) mysqlServer(name, dsn string, maxConns int) {
	e.servers[name] = func(int) fleet.Server {
		s, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn, MaxConns: maxConns})
		if err != nil {
			e.t.Fatal(err)
		}
		return s
	}
}

// mysqlTenants makes tenants of server out of databases holding the
// millbox tables, written through root.
func (e *fleetEnv) mysqlTenants(server string, root *sql.DB, dbs []string) []fleet.Tenant {
	var ts []fleet.Tenant
	for _, name := range dbs {
		tn := fleet.Tenant{ID: "t-" + name, Server: server, Database: name}
		e.writer(tn, stdsql.WrapDB(root), mysql.MustNew(mysql.Options{Database: name, WithoutInbox: true}))
		ts = append(ts, tn)
	}
	return ts
}

// publishAll writes perKey messages to each of keys keys of every
// tenant, numbered from seq from, a few per transaction, from a goroutine
// per tenant, and waits until every message arrived.
func (e *fleetEnv) publishAll(tenants []fleet.Tenant, keys, from, perKey int) {
	e.t.Helper()
	want := map[string]int{}
	for _, tn := range tenants {
		want[tn.ID] = e.byTenant()[tn.ID] + keys*perKey
	}
	const perTx = 4
	var wg sync.WaitGroup
	errs := make(chan error, len(tenants))
	for _, tn := range tenants {
		wg.Go(func() {
			for i := 0; i < perKey; i += perTx {
				for k := range keys {
					if err := e.tryPublish(tn, "k"+strconv.Itoa(k), from+i, min(perTx, perKey-i)); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
	for _, tn := range tenants {
		e.waitTenant(tn.ID, want[tn.ID])
	}
}

// fleetUntil waits for cond, failing the test with what after fleetWait.
func fleetUntil(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(fleetWait)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting until %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %v", what, fleetWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readyz asks the fleet's health handler whether it is ready.
func readyz(t *testing.T, h http.Handler) (code int, down map[string]string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	var body struct {
		Down []struct {
			Tenant string `json:"tenant"`
			Error  string `json:"error"`
		} `json:"down"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("/readyz answered %d with %q: %v", rec.Code, rec.Body.String(), err)
	}
	down = map[string]string{}
	for _, d := range body.Down {
		down[d.Tenant] = d.Error
	}
	return rec.Code, down
}

// TestFleetTenantDown runs a fleet whose tenants include a database that
// does not exist, one without the millbox tables and one on a server
// that does not answer: the other tenants' messages all arrive, in key
// order; Status and /readyz name the three down tenants with their errors
// (the missing tables' error says how to migrate); once the database is
// created and the tables migrated, those two tenants' messages arrive
// too, and once the unreachable one is removed the fleet is ready.
func TestFleetTenantDown(t *testing.T) {
	e := newFleetEnv(t)
	e.server("pg", pgfleet.StatDoorbell)
	a, b := e.tenantDatabase("pg", true), e.tenantDatabase("pg", true)
	gone := e.missingDatabase("pg")
	bare := e.tenantDatabase("pg", false)
	// Nothing listens on port 1.
	e.servers["dead"] = func(int) fleet.Server {
		s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: "postgres://root@127.0.0.1:1/test?sslmode=disable&connect_timeout=5", Doorbell: pgfleet.NoDoorbell})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dead := fleet.Tenant{ID: "t-unreachable", Server: "dead"}
	fl := e.start(nil)
	health := fleet.HealthHandler(fl, fleet.HealthOptions{})
	ctx := testenv.Ctx(t, 2*time.Minute)
	if err := fl.PutTenants(ctx, a, b, gone, bare, dead); err != nil {
		t.Fatal(err)
	}
	e.publishAll([]fleet.Tenant{a, b}, 3, 0, 20)
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)

	// The two tenants are named down, each with its own error; the
	// others are not.
	isDown := func(want map[string]string) func() (bool, error) {
		return func() (bool, error) {
			st, err := fl.Status(ctx)
			if err != nil {
				return false, err
			}
			got := map[string]string{}
			for _, ts := range st.Tenants {
				if ts.Down {
					got[ts.ID] = ts.LastError
				}
			}
			if len(got) != len(want) || st.Totals.Down != len(want) {
				return false, nil
			}
			for id, text := range want {
				if !strings.Contains(got[id], text) {
					return false, nil
				}
			}
			return true, nil
		}
	}
	missing := map[string]string{
		gone.ID: `database "` + gone.Database + `" does not exist`,
		bare.ID: "sqladapters.Migrate",
		dead.ID: "127.0.0.1:1",
	}
	fleetUntil(t, "Status names the three tenants down with their errors", isDown(missing))
	code, down := readyz(t, health)
	if code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz answered %d with three tenants down, want %d", code, http.StatusServiceUnavailable)
	}
	if len(down) != len(missing) {
		t.Fatalf("/readyz names %v down, want %s, %s and %s", down, gone.ID, bare.ID, dead.ID)
	}
	for id, text := range missing {
		if !strings.Contains(down[id], text) {
			t.Fatalf("/readyz says tenant %s is down with %q, want an error that says %q", id, down[id], text)
		}
	}
	t.Logf("down: %v", down)

	// Fixed, both are served: a doorbell ring or the next look after the
	// failure finds their rows.
	e.createDatabase(gone, true)
	e.mu.Lock()
	w := e.writers[bare.ID]
	e.mu.Unlock()
	e.migrate(bare, w.db, w.dialect)
	e.publishAll([]fleet.Tenant{gone, bare, a}, 2, 100, 5)
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)
	fleetUntil(t, "only the unreachable tenant is down", isDown(map[string]string{dead.ID: "127.0.0.1:1"}))
	if err := fl.RemoveTenants(ctx, dead.ID); err != nil {
		t.Fatal(err)
	}
	fleetUntil(t, "no tenant is down", isDown(nil))
	if code, down := readyz(t, health); code != http.StatusOK {
		t.Fatalf("/readyz answered %d once every tenant was fixed (down: %v), want 200", code, down)
	}
}

// TestFleetMixedServers runs one fleet over tenants of PostgreSQL (a
// database each) and of MariaDB/MySQL (a database each): every message of
// each arrives, in its key's order.
func TestFleetMixedServers(t *testing.T) {
	e := newFleetEnv(t)
	root := testenv.MySQL(t)
	e.server("pg", pgfleet.StatDoorbell)
	dbs, _, dsn := mysqlFleetSetup(t, root, 2)
	e.mysqlServer("my", dsn, 0)
	tenants := append([]fleet.Tenant{e.tenantDatabase("pg", true), e.tenantDatabase("pg", true)}, e.mysqlTenants("my", root, dbs)...)
	fl := e.start(nil)
	if err := fl.PutTenants(testenv.Ctx(t, time.Minute), tenants...); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.publishAll(tenants, 3, 0, 20)
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)
	// Again once the tenants may have gone idle: a doorbell of each
	// kind wakes its own.
	e.publishAll(tenants, 2, 100, 5)
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)
	t.Logf("%d messages of %d PostgreSQL and %d MariaDB tenants in %v", len(e.rec.Messages()), 2, 2, time.Since(start).Round(time.Millisecond))
}

// TestFleetCloseDuringLeaseRound closes an instance while its lease loop
// waits for the control database (a lock held on the members table): Run
// returns once the round ended, however the round's end and the last of
// the instance's other work interleave.
func TestFleetCloseDuringLeaseRound(t *testing.T) {
	e := newFleetEnv(t)
	e.server("pg", pgfleet.StatDoorbell)
	tn := e.tenantDatabase("pg", true)
	f, err := fleet.New(e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background()) }()
	ctx := testenv.Ctx(t, time.Minute)
	if err := f.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.PutTenants(ctx, tn); err != nil {
		t.Fatal(err)
	}
	e.publishAll([]fleet.Tenant{tn}, 1, 0, 3)
	// Idle tenants leave nothing for the instance to do at Close but end
	// its lease loop.
	fleetUntil(t, "the tenant is idle", func() (bool, error) {
		st, err := f.Status(ctx)
		return err == nil && len(st.Tenants) == 1 && st.Tenants[0].State == "idle", err
	})

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	members := pgx.Identifier{e.schema, postgres.DefaultFleetPrefix + "_members"}.Sanitize()
	if _, err := tx.Exec(ctx, `LOCK TABLE `+members+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	fleetUntil(t, "the lease loop waits for the lock", func() (bool, error) {
		var waiting bool
		err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = $1::regclass AND NOT granted)`, members).Scan(&waiting)
		return waiting, err
	})
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	// The lock goes soon after, so that leaving the members (after Run's
	// loops ended) does not wait for it; when exactly does not matter.
	time.Sleep(100 * time.Millisecond)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(fleetWait):
		t.Fatalf("Run did not return %v after Close", fleetWait)
	}
	if err := <-closed; err != nil {
		t.Fatalf("close: %v", err)
	}
}
