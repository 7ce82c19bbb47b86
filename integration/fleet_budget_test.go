package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
)

// fleetConns samples, every few milliseconds until stop, the connections
// the servers list for a test's fleet: PostgreSQL's by application_name
// (one snapshot of pg_stat_activity per look, so that the connections of
// both of a test's PostgreSQL servers are counted at one moment) and
// MariaDB's by user.
type fleetConns struct {
	stop, done chan struct{}

	mu       sync.Mutex
	samples  int
	pgHandle int            // most handle connections of PostgreSQL at once
	pgAll    int            // the same with the doorbells'
	pgServer map[string]int // most handle connections per PostgreSQL server
	my       int            // most MariaDB connections, doorbells' included
	err      error
}

func watchFleetConns(t *testing.T, e *fleetEnv, root *sql.DB, myUser string) *fleetConns {
	w := &fleetConns{stop: make(chan struct{}), done: make(chan struct{}), pgServer: map[string]int{}}
	go func() {
		defer close(w.done)
		for {
			pg, my, err := e.conns(root, myUser)
			w.mu.Lock()
			if err != nil && w.err == nil {
				w.err = err
			}
			w.samples++
			handles := 0
			for server, n := range pg {
				if strings.HasSuffix(server, pgfleet.DoorbellSuffix) {
					continue
				}
				handles += n
				w.pgServer[server] = max(w.pgServer[server], n)
			}
			all := 0
			for _, n := range pg {
				all += n
			}
			w.pgHandle, w.pgAll, w.my = max(w.pgHandle, handles), max(w.pgAll, all), max(w.my, my)
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(w.end)
	return w
}

func (w *fleetConns) end() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// conns counts the connections the servers list now: PostgreSQL's by
// server (the instance's suffix taken off, the doorbell's kept), and
// MariaDB's of user.
func (e *fleetEnv) conns(root *sql.DB, user string) (pg map[string]int, my int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := e.pool.Query(ctx, `SELECT application_name FROM pg_stat_activity WHERE starts_with(application_name, $1)`, e.app+"_")
	if err != nil {
		return nil, 0, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, 0, err
	}
	pg = map[string]int{}
	for _, name := range names {
		// <app>_<server>_<instance>, and the doorbell's suffix.
		name = strings.TrimPrefix(name, e.app+"_")
		server, rest, _ := strings.Cut(name, "_")
		if strings.HasSuffix(rest, pgfleet.DoorbellSuffix) {
			server += pgfleet.DoorbellSuffix
		}
		pg[server]++
	}
	if root != nil {
		err = root.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = ?`, user).Scan(&my)
	}
	return pg, my, err
}

// TestFleetConnectionBudget runs two instances over 30 busy tenants
// (databases of two PostgreSQL servers and of a MariaDB server) with a
// small budget, and checks from the servers' own lists of connections
// that the fleet never holds more than the package documentation
// promises: per instance MaxConns to the tenants, MaxConnsPerServer to one
// server, plus a doorbell connection per server. Once the tenants are idle
// past their hold time, only the doorbells' connections are left.
func TestFleetConnectionBudget(t *testing.T) {
	const (
		instances = 2
		maxConns  = 4
		perServer = 3
	)
	e := newFleetEnv(t)
	root := testenv.MySQL(t)
	// Small handles: a query of a handle that holds fewer than its
	// MaxConns waits for the connection it dials, hence for a place, even
	// when the handle's own connections come free meanwhile (see
	// pgfleet.ServerConfig.MaxConns). Handles that together may want more
	// than the budget then wait on each other until their queries time
	// out; with one connection per PostgreSQL handle, no handle that holds
	// a place waits for another.
	e.serverConns("pga", pgfleet.StatDoorbell, 1)
	e.serverConns("pgb", pgfleet.StatDoorbell, 1)
	dbs, user, dsn := mysqlFleetSetup(t, root, 22)
	e.mysqlServer("my", dsn, 2)
	tenants := e.mysqlTenants("my", root, dbs)
	for i := range 8 {
		tenants = append(tenants, e.tenantDatabase([]string{"pga", "pgb"}[i%2], true))
	}
	conns := watchFleetConns(t, e, root, user)
	var fleets []*fleet.Fleet
	for range instances {
		fleets = append(fleets, e.start(func(c *fleet.Config) { c.MaxConns, c.MaxConnsPerServer = maxConns, perServer }))
	}
	ctx := testenv.Ctx(t, 2*time.Minute)
	if err := fleets[0].PutTenants(ctx, tenants...); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	e.publishAll(tenants, 3, 0, 12)
	took := time.Since(start)
	idleStart := time.Now()
	conformance.CheckKeyOrder(t, e.rec.Messages(), forwarder.DefaultKeyMetadataField)

	// Idle past their hold time, the tenants let their connections go:
	// the doorbells' are left, one per server for each instance that
	// holds a tenant of it.
	var seen string
	defer func() {
		if t.Failed() {
			t.Logf("connections last listed: PostgreSQL %s", seen)
		}
	}()
	fleetUntil(t, "only the doorbells' connections are left", func() (bool, error) {
		bells := map[string]int{}
		for _, fl := range fleets {
			st, err := fl.Status(ctx)
			if err != nil {
				return false, err
			}
			has := map[string]bool{}
			for _, ts := range st.Tenants {
				has[ts.Server] = true
			}
			for server := range has {
				bells[server]++
			}
		}
		pg, my, err := e.conns(root, user)
		if err != nil {
			return false, err
		}
		seen = fmt.Sprintf("%v, MariaDB %d; doorbells expected %v", pg, my, bells)
		return pg["pga"] == 0 && pg["pgb"] == 0 && pg["pga"+pgfleet.DoorbellSuffix] == bells["pga"] &&
			pg["pgb"+pgfleet.DoorbellSuffix] == bells["pgb"] && my == bells["my"], nil
	})
	idle := time.Since(idleStart)
	for _, fl := range fleets {
		st, err := fl.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Totals.Hot != 0 || st.Totals.Down != 0 {
			t.Fatalf("instance %s: %d tenants hot and %d down once every message arrived, want none", st.Instance, st.Totals.Hot, st.Totals.Down)
		}
	}
	conns.end()

	conns.mu.Lock()
	defer conns.mu.Unlock()
	if conns.err != nil {
		t.Fatalf("listing the servers' connections: %v", conns.err)
	}
	t.Logf("%d messages of %d tenants in %v, idle %v later; the servers listed at most %d PostgreSQL handle connections (per server %v), %d with the doorbells', and %d MariaDB connections, in %d looks",
		len(e.rec.Messages()), len(tenants), took.Round(time.Millisecond), idle.Round(time.Millisecond), conns.pgHandle, conns.pgServer, conns.pgAll, conns.my, conns.samples)
	if conns.pgHandle > instances*maxConns {
		t.Errorf("PostgreSQL listed %d connections of the tenants' handles at once, more than %d instances × MaxConns %d", conns.pgHandle, instances, maxConns)
	}
	for server, n := range conns.pgServer {
		if n > instances*perServer {
			t.Errorf("PostgreSQL listed %d connections of server %s's handles at once, more than %d instances × MaxConnsPerServer %d", n, server, instances, perServer)
		}
	}
	if conns.pgAll > instances*(maxConns+2) {
		t.Errorf("PostgreSQL listed %d connections of the fleet at once, more than %d instances × (MaxConns %d + a doorbell for each of 2 servers)", conns.pgAll, instances, maxConns)
	}
	if conns.my > instances*(perServer+1) {
		t.Errorf("MariaDB listed %d connections of the fleet at once, more than %d instances × (MaxConnsPerServer %d + a doorbell)", conns.my, instances, perServer)
	}
	if conns.pgHandle == 0 || conns.my <= instances {
		t.Fatalf("the servers listed at most %d PostgreSQL handle connections and %d MariaDB connections: the test did not load the fleet", conns.pgHandle, conns.my)
	}
}
