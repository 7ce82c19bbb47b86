package integration_test

import (
	"context"
	"database/sql"
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
	control sqladapters.DB
	store   sqladapters.FleetStore
	rec     *conformance.Recorder
	servers map[string]fleet.Server
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
	return &fleetEnv{t: t, pool: pool, control: db, store: store, rec: conformance.NewRecorder(), servers: map[string]fleet.Server{}}
}

// server adds a server of the test database's PostgreSQL.
func (e *fleetEnv) server(name string, bell pgfleet.DoorbellKind) {
	s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), Doorbell: bell, ApplicationName: "mbfleet_" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	e.servers[name] = s
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
	return fleet.Tenant{ID: "t-" + schema, Server: server, Schema: schema}
}

// start runs one fleet instance until the test ends.
func (e *fleetEnv) start(edit func(*fleet.Config)) *fleet.Fleet {
	e.t.Helper()
	cfg := fleet.Config{
		Control:         e.control,
		Store:           e.store,
		Servers:         e.servers,
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
	f, err := fleet.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(context.Background()) }()
	e.t.Cleanup(func() {
		if err := f.Close(); err != nil {
			e.t.Errorf("close: %v", err)
		}
		if err := <-done; err != nil {
			e.t.Errorf("run: %v", err)
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
	ctx := testenv.Ctx(e.t, time.Minute)
	d := postgres.MustNew(postgres.Options{Schema: t.Schema, WithoutInbox: true})
	tx, err := pgxv5.WrapPool(e.pool).Begin(ctx, sql.TxOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		e.t.Fatal(err)
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
		e.t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
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
