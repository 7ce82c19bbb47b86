package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// A fleet of the tests' own: its control tables in a schema of the test
// database, its tenants schemas of that database or databases of the
// server, a recorder as the destination.
type fleetEnv struct {
	t       *testing.T
	pool    *pgxpool.Pool
	schema  string // the control tables' schema
	control sqladapters.DB
	store   sqladapters.FleetStore
	rec     *conformance.Recorder
	// app starts the application_name of this test's PostgreSQL
	// connections, so that pg_stat_activity tells them from other tests'.
	app string
	// servers makes each instance its own servers, by name: a doorbell
	// watches for one instance only.
	servers map[string]func(instance int) fleet.Server
	started int // instances started

	mu      sync.Mutex
	writers map[string]fleetWriter // by tenant ID
}

// fleetWriter is how the test writes into a tenant's outbox.
type fleetWriter struct {
	db      sqladapters.DB
	dialect sqladapters.Dialect
}

func newFleetEnv(t *testing.T) *fleetEnv {
	t.Helper()
	pool := testenv.Postgres(t)
	ctx := testenv.Ctx(t, time.Minute)
	schema := testenv.PostgresSchema(t, pool)
	store := postgres.MustNewFleet(postgres.FleetOptions{Schema: schema})
	db := pgxv5.WrapPool(pool)
	if err := sqladapters.MigrateFleet(ctx, db, store); err != nil {
		t.Fatal(err)
	}
	return &fleetEnv{t: t, pool: pool, schema: schema, control: db, store: store, rec: conformance.NewRecorder(),
		app: testenv.UniqueName("mbf"), servers: map[string]func(int) fleet.Server{}, writers: map[string]fleetWriter{}}
}

// server adds a server of the test database's PostgreSQL. The
// connections of instance i are named pgApp(name, i).
func (e *fleetEnv) server(name string, bell pgfleet.DoorbellKind) { e.serverConns(name, bell, 0) }

// serverConns is server with at most maxConns connections per handle (0:
// pgfleet's default).
func (e *fleetEnv) serverConns(name string, bell pgfleet.DoorbellKind, maxConns int32) {
	e.servers[name] = func(i int) fleet.Server {
		s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), Doorbell: bell, ApplicationName: e.pgApp(name, i), MaxConns: maxConns})
		if err != nil {
			e.t.Fatal(err)
		}
		return s
	}
}

// pgApp is the application_name of the handles' connections of server
// name in instance i; the doorbell's add pgfleet.DoorbellSuffix.
func (e *fleetEnv) pgApp(name string, i int) string {
	return e.app + "_" + name + "_" + strconv.Itoa(i)
}

// tenantSchema creates a schema of the test database with the millbox
// tables: a tenant of a server named after the test database.
func (e *fleetEnv) tenantSchema(server string) fleet.Tenant {
	e.t.Helper()
	schema := testenv.PostgresSchema(e.t, e.pool)
	d := postgres.MustNew(postgres.Options{Schema: schema, WithoutInbox: true})
	if err := sqladapters.Migrate(testenv.Ctx(e.t, time.Minute), pgxv5.WrapPool(e.pool), d); err != nil {
		e.t.Fatal(err)
	}
	tn := fleet.Tenant{ID: "t-" + schema, Server: server, Schema: schema}
	e.writer(tn, pgxv5.WrapPool(e.pool), d)
	return tn
}

// writer records how the test writes into tenant t's outbox.
func (e *fleetEnv) writer(t fleet.Tenant, db sqladapters.DB, d sqladapters.Dialect) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.writers[t.ID] = fleetWriter{db: db, dialect: d}
}

// config is the configuration of the next instance, changed by edit.
func (e *fleetEnv) config(edit func(*fleet.Config)) fleet.Config {
	servers := map[string]fleet.Server{}
	for name, mk := range e.servers {
		servers[name] = mk(e.started)
	}
	e.started++
	cfg := fleet.Config{
		Control:         e.control,
		Store:           e.store,
		Servers:         servers,
		Destination:     e.rec,
		CatalogInterval: 100 * time.Millisecond,
		LeaseTTL:        3 * time.Second,
		MinHold:         200 * time.Millisecond,
		MaxHold:         time.Second,
		Logger:          testenv.Logger(e.t),
		Forwarder:       forwarder.Config{Retry: forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}},
	}
	if edit != nil {
		edit(&cfg)
	}
	return cfg
}

// start runs one fleet instance until the test ends.
func (e *fleetEnv) start(edit func(*fleet.Config)) *fleet.Fleet {
	e.t.Helper()
	f, err := fleet.New(e.config(edit))
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background()) }()
	e.t.Cleanup(func() {
		if err := f.Close(); err != nil {
			e.t.Errorf("close: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("run: %v", err)
			}
		case <-time.After(fleetWait):
			e.t.Errorf("Run did not return %v after Close", fleetWait)
		}
	})
	if err := f.Ready(testenv.Ctx(e.t, 30*time.Second)); err != nil {
		e.t.Fatal(err)
	}
	return f
}

// publish commits n messages of key into tenant t's outbox, numbered from
// seq, in one transaction.
func (e *fleetEnv) publish(t fleet.Tenant, key string, seq, n int) {
	e.t.Helper()
	if err := e.tryPublish(t, key, seq, n); err != nil {
		e.t.Fatal(err)
	}
}

// tryPublish is publish for any goroutine: it returns what failed.
func (e *fleetEnv) tryPublish(t fleet.Tenant, key string, seq, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.mu.Lock()
	w, ok := e.writers[t.ID]
	e.mu.Unlock()
	if !ok {
		return fmt.Errorf("tenant %s: the test has no writer for it", t.ID)
	}
	tx, err := w.db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return err
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: w.dialect})
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), []byte(t.ID))
		msgs[i].Metadata.Set(forwarder.DefaultKeyMetadataField, t.ID+"/"+key)
		msgs[i].Metadata.Set("seq", strconv.Itoa(seq+i))
		msgs[i].Metadata.Set("tenant", t.ID)
	}
	if err := pub.Publish("fleet", msgs...); err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// byTenant counts the distinct messages that arrived per tenant.
func (e *fleetEnv) byTenant() map[string]int {
	seen := map[string]map[string]bool{}
	for _, m := range e.rec.Messages() {
		tn := m.Metadata.Get("tenant")
		if seen[tn] == nil {
			seen[tn] = map[string]bool{}
		}
		seen[tn][m.UUID] = true
	}
	n := map[string]int{}
	for tn, s := range seen {
		n[tn] = len(s)
	}
	return n
}

// waitTenant waits until n distinct messages of tenant arrived.
func (e *fleetEnv) waitTenant(tenant string, n int) {
	e.t.Helper()
	deadline := time.Now().Add(fleetWait)
	for e.byTenant()[tenant] < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("tenant %s: %d of %d messages arrived within %v", tenant, e.byTenant()[tenant], n, fleetWait)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Tenants added and removed while messages flow: a tenant put into the
// catalog is forwarded without a restart, every message of every tenant
// arrives in its key's order, and a removed tenant is let go (its later
// messages stay in its outbox).
func TestFleetTenantsComeAndGo(t *testing.T) {
	e := newFleetEnv(t)
	e.server("pg", pgfleet.SlotDoorbell)
	a, b := e.tenantSchema("pg"), e.tenantSchema("pg")
	fl := e.start(nil)
	ctx := testenv.Ctx(t, 2*time.Minute)
	if err := fl.PutTenants(ctx, a, b); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, tn := range []fleet.Tenant{a, b} {
		wg.Go(func() {
			for i := range 10 {
				e.publish(tn, "k"+strconv.Itoa(i%3), i*5, 5)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	c := e.tenantSchema("pg")
	if err := fl.PutTenants(ctx, c); err != nil {
		t.Fatal(err)
	}
	e.publish(c, "k", 0, 5)
	wg.Wait()
	e.waitTenant(a.ID, 50)
	e.waitTenant(b.ID, 50)
	e.waitTenant(c.ID, 5)
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)

	if err := fl.RemoveTenants(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(fleetWait)
	for {
		st, err := fl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held := false
		for _, ts := range st.Tenants {
			held = held || ts.ID == b.ID
		}
		if !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed tenant %s is still held: %+v", b.ID, st.Tenants)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.publish(b, "k", 100, 3)
	e.publish(a, "k", 100, 3)
	e.waitTenant(a.ID, 53)
	time.Sleep(500 * time.Millisecond)
	if n := e.byTenant()[b.ID]; n != 50 {
		t.Fatalf("the removed tenant's messages were forwarded: %d arrived, want 50", n)
	}

}
