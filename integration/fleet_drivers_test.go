package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/mysqlfleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// The fleet's drivers against the real servers: every connection a
// handle or a doorbell opens goes through the fleet's dial function and
// never more at once than it allows (as the server lists them), an idle
// handle closes its connections by itself, and every doorbell rings for
// a committed insert.

// fleetWait is how long a test waits for something that should happen
// within a second or so; the timing itself is the benchmark's to
// measure, the tests log it.
const fleetWait = 30 * time.Second

// pgTenantDatabase creates a database holding the millbox tables
// (without the inbox), dropped after the test, and returns its name.
func pgTenantDatabase(t *testing.T, admin *pgxpool.Pool) string {
	t.Helper()
	ctx := testenv.Ctx(t, 2*time.Minute)
	name := testenv.UniqueName("fleet_")
	if _, err := admin.Exec(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, `DROP DATABASE IF EXISTS "`+name+`" WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{WithoutInbox: true})); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return name
}

// pgClients lists the client ports of the server's connections named
// app.
func pgClients(admin *pgxpool.Pool, app string) func(ctx context.Context) ([]int, error) {
	return func(ctx context.Context) ([]int, error) {
		rows, err := admin.Query(ctx, `SELECT client_port FROM pg_stat_activity WHERE application_name = $1`, app)
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, pgx.RowTo[int])
	}
}

// pgBudget is a budget whose places come back once the server lists the
// connection no more.
func pgBudget(admin *pgxpool.Pool, limit int, app string) *testenv.Budget {
	return testenv.NewBudget(limit, func(ctx context.Context, port int) (bool, error) {
		var gone bool
		err := admin.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE client_port = $1 AND application_name = $2)`, port, app).Scan(&gone)
		return gone, err
	})
}

// fleetWaitClosed waits until the server lists none of the connections and
// the budget counts none open, without closing anything, and returns how
// long that took.
func fleetWaitClosed(t *testing.T, budget *testenv.Budget, list func(ctx context.Context) ([]int, error)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ports, err := list(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if len(ports) == 0 && budget.Open() == 0 {
			return time.Since(start)
		}
		if time.Since(start) > fleetWait {
			t.Fatalf("%d connections still open on the server (%d counted by the budget) %v after the last query: idle connections do not close",
				len(ports), budget.Open(), fleetWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// fleetLoad runs queries on each db from several goroutines at once, more
// than the budget allows.
func fleetLoad(t *testing.T, query string, dbs ...sqladapters.DB) {
	t.Helper()
	ctx := testenv.Ctx(t, 2*time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for _, db := range dbs {
		for range 4 {
			wg.Go(func() {
				for range 10 {
					if _, err := db.Exec(ctx, query); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func fleetQueryString(t *testing.T, db sqladapters.DB, query string) string {
	t.Helper()
	rows, err := db.Query(testenv.Ctx(t, time.Minute), query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var name string
	for rows.Next() {
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestFleetPostgresHandles checks pgfleet's handles: each on its tenant's
// database; under a load that wants more connections than the fleet's
// budget gives two handles, the server never has more than the budget
// (nor one that did not go through its dial function); and once idle,
// the handles close their connections by themselves.
func TestFleetPostgresHandles(t *testing.T) {
	admin := testenv.Postgres(t)
	tenantDB := pgTenantDatabase(t, admin)
	app := testenv.UniqueName("fleet_")
	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), MaxConns: 2, ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	budget := pgBudget(admin, 2, app)
	conns := testenv.WatchServerConns(t, budget, pgClients(admin, app))
	const idle = time.Second
	ctx := testenv.Ctx(t, 2*time.Minute)
	a, err := srv.Open(ctx, tenantDB, budget.Dial, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := srv.Open(ctx, "", budget.Dial, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if got := fleetQueryString(t, a.DB(), `SELECT current_database()`); got != tenantDB {
		t.Fatalf("the tenant's handle is on database %q, want %q", got, tenantDB)
	}
	dsn, err := pgx.ParseConfig(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	if got := fleetQueryString(t, b.DB(), `SELECT current_database()`); got != dsn.Database {
		t.Fatalf("the handle of database \"\" is on %q, want the DSN's %q", got, dsn.Database)
	}
	took := fleetWaitClosed(t, budget, pgClients(admin, app))
	t.Logf("idle handles closed their connections %v after the last query (idle %v, health check every %v)", took.Round(time.Millisecond), idle, idle/2)

	// A query that waits for a place waits until another handle's
	// connection is idle long enough to close.
	fleetLoad(t, `SELECT pg_sleep(0.01)`, a.DB(), b.DB())
	took = fleetWaitClosed(t, budget, pgClients(admin, app))
	t.Logf("after the load, %v", took.Round(time.Millisecond))
	seen, samples := conns.Stop()
	if seen == 0 || budget.Max() != budget.Limit() {
		t.Fatalf("the server listed at most %d connections in %d looks, the budget had at most %d open: the test did not load the handles", seen, samples, budget.Max())
	}
	t.Logf("the server listed at most %d connections in %d looks (budget %d)", seen, samples, budget.Limit())
}

// TestFleetPostgresFallbackHosts checks that the hosts of a multi-host
// DSN are all dialled through the fleet's dial function, and that a dead
// first host falls back to the next.
func TestFleetPostgresFallbackHosts(t *testing.T) {
	admin := testenv.Postgres(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	u, err := url.Parse(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	live := u.Host
	u.Host = dead + "," + live
	app := testenv.UniqueName("fleet_")
	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: u.String(), ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	budget := pgBudget(admin, 1, app)
	h, err := srv.Open(testenv.Ctx(t, time.Minute), "", budget.Dial, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got := fleetQueryString(t, h.DB(), `SELECT 'reached'`); got != "reached" {
		t.Fatalf("query returned %q", got)
	}
	addrs, failed := budget.Addrs()
	if len(addrs) < 2 || addrs[0] != dead || failed < 1 || !slices.Contains(addrs, live) {
		t.Fatalf("dialled %v (%d failed), want the dead host %s first, then %s", addrs, failed, dead, live)
	}
}

// fleetWatching runs a doorbell's Watch and records its rings and gaps.
type fleetWatching struct {
	rings chan string
	gaps  chan struct{}
	done  chan error
	stop  context.CancelFunc

	mu      sync.Mutex
	tenants []fleet.Tenant
}

func fleetWatch(t *testing.T, bell fleet.Doorbell, dial fleet.DialFunc, tenants ...fleet.Tenant) *fleetWatching {
	t.Helper()
	if bell == nil {
		t.Fatal("the server has no doorbell")
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &fleetWatching{rings: make(chan string, 10000), gaps: make(chan struct{}, 100), done: make(chan error, 1), stop: cancel, tenants: tenants}
	go func() {
		w.done <- bell.Watch(ctx, fleet.Watch{
			Tenants: func() []fleet.Tenant {
				w.mu.Lock()
				defer w.mu.Unlock()
				return slices.Clone(w.tenants)
			},
			Ring: func(id string) {
				select {
				case w.rings <- id:
				default:
				}
			},
			Gap: func() {
				select {
				case w.gaps <- struct{}{}:
				default:
				}
			},
			Dial:   dial,
			Logger: testenv.Logger(t),
		})
	}()
	t.Cleanup(func() { w.end(t) })
	return w
}

func (w *fleetWatching) setTenants(tenants ...fleet.Tenant) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tenants = tenants
}

// end stops the watch and checks that it returned because it was
// stopped.
func (w *fleetWatching) end(t *testing.T) {
	t.Helper()
	if w.stop == nil {
		return
	}
	w.stop()
	w.stop = nil
	select {
	case err := <-w.done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	case <-time.After(fleetWait):
		t.Errorf("Watch did not return %v after its context ended", fleetWait)
	}
}

// drain forgets the rings so far.
func (w *fleetWatching) drain() {
	for {
		select {
		case <-w.rings:
		default:
			return
		}
	}
}

// ring waits for a ring of each of ids, passing over others, and
// returns when the last came.
func (w *fleetWatching) ring(t *testing.T, ids ...string) time.Time {
	t.Helper()
	deadline := time.After(fleetWait)
	for len(ids) > 0 {
		select {
		case got := <-w.rings:
			ids = slices.DeleteFunc(ids, func(id string) bool { return id == got })
		case err := <-w.done:
			t.Fatalf("Watch returned while waiting for a ring of %q: %v", ids, err)
		case <-deadline:
			t.Fatalf("no ring of %q within %v", ids, fleetWait)
		}
	}
	return time.Now()
}

// gap waits for a call of Gap.
func (w *fleetWatching) gap(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-w.gaps:
	case err := <-w.done:
		t.Fatalf("Watch returned while waiting for a gap: %v", err)
	case <-time.After(timeout):
		t.Fatalf("no gap within %v", timeout)
	}
}

// fleetPublish commits msgs into the dialect's tables through db and returns
// when the commit returned.
func fleetPublish(t *testing.T, db sqladapters.DB, d sqladapters.Dialect, msgs ...sqladapters.OutboxMessage) time.Time {
	t.Helper()
	ctx := testenv.Ctx(t, time.Minute)
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.InsertOutbox(ctx, tx, msgs); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

func fleetMessage(due time.Time) sqladapters.OutboxMessage {
	return sqladapters.OutboxMessage{Topic: "fleet", UUID: testenv.UniqueName("m"), Payload: []byte("p"), Metadata: []byte("{}"), DueAt: due}
}

// TestFleetPostgresStatDoorbell checks pgfleet's stat doorbell on two
// tenant databases: it rings each at first sight, rings a tenant for a
// commit from a writer whose connection was idle (so that its session
// reports its statistics as the transaction ends), and calls Gap after
// the tenant's statistics are reset. Its one connection goes through the
// doorbell's dial function.
func TestFleetPostgresStatDoorbell(t *testing.T) {
	admin := testenv.Postgres(t)
	dbA, dbB := pgTenantDatabase(t, admin), pgTenantDatabase(t, admin)
	app := testenv.UniqueName("fleet_")
	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), Doorbell: pgfleet.StatDoorbell, DoorbellInterval: 50 * time.Millisecond, ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	budget := pgBudget(admin, 1, app+pgfleet.DoorbellSuffix)
	conns := testenv.WatchServerConns(t, budget, pgClients(admin, app+pgfleet.DoorbellSuffix))
	w := fleetWatch(t, srv.Doorbell(), budget.Dial, fleet.Tenant{ID: "a", Database: dbA}, fleet.Tenant{ID: "b", Database: dbB})
	w.ring(t, "a", "b") // at first sight

	ctx := testenv.Ctx(t, 2*time.Minute)
	cfg, err := pgx.ParseConfig(testenv.PostgresURL())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = dbA
	writer, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	// A session reports when it goes idle if its last report is a second
	// old: the connection has been idle longer.
	time.Sleep(1100 * time.Millisecond)
	w.drain()
	committed := fleetPublish(t, pgxv5.WrapConn(writer), postgres.MustNew(postgres.Options{WithoutInbox: true}), fleetMessage(time.Time{}))
	t.Logf("stat doorbell: ring %v after the commit", w.ring(t, "a").Sub(committed).Round(time.Millisecond))

	if _, err := writer.Exec(ctx, `SELECT pg_stat_reset()`); err != nil {
		t.Fatal(err)
	}
	w.gap(t, fleetWait)
	w.end(t)
	if n := budget.Open(); n != 0 {
		t.Fatalf("%d doorbell connections open after Watch returned", n)
	}
	if seen, _ := conns.Stop(); seen != 1 {
		t.Fatalf("the server listed at most %d doorbell connections, want 1", seen)
	}
}

// TestFleetPostgresSlotDoorbell checks pgfleet's slot doorbell on
// tenants that are schemas of one database: a gap when its stream starts,
// rings for commits into a tenant's outbox and scheduled table, a tenant
// added at run time rung when its tables joined the publication and for
// its commits, also when its tables were created after it was added, a
// tenant removed leaving the publication, a publication a dead process
// left behind dropped, and nothing left once it stops.
func TestFleetPostgresSlotDoorbell(t *testing.T) {
	admin := testenv.Postgres(t)
	db := pgxv5.WrapPool(admin)
	ctx := testenv.Ctx(t, 3*time.Minute)
	var wal string
	if err := admin.QueryRow(ctx, `SHOW wal_level`).Scan(&wal); err != nil {
		t.Fatal(err)
	}
	if wal != "logical" {
		testenv.Unavailable(t, "PostgreSQL with wal_level=logical", errors.New("wal_level is "+wal))
	}
	opts := postgres.Options{WithoutInbox: true}
	da, dbB, dc := testenv.PostgresDialect(t, db, admin, opts), testenv.PostgresDialect(t, db, admin, opts), testenv.PostgresDialect(t, db, admin, opts)
	a, b, c := fleet.Tenant{ID: "a", Schema: da.Schema()}, fleet.Tenant{ID: "b", Schema: dbB.Schema()}, fleet.Tenant{ID: "c", Schema: dc.Schema()}

	leftover := "millbox_fleet_" + strings.Repeat("0", 4) + testenv.UniqueName("")
	if _, err := admin.Exec(ctx, `CREATE PUBLICATION `+leftover); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), `DROP PUBLICATION IF EXISTS `+leftover) })

	app := testenv.UniqueName("fleet_")
	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), Doorbell: pgfleet.SlotDoorbell, DoorbellInterval: 50 * time.Millisecond, ApplicationName: app})
	if err != nil {
		t.Fatal(err)
	}
	budget := pgBudget(admin, 2, app+pgfleet.DoorbellSuffix)
	conns := testenv.WatchServerConns(t, budget, pgClients(admin, app+pgfleet.DoorbellSuffix))
	w := fleetWatch(t, srv.Doorbell(), budget.Dial, a, b)
	// Creating the slot waits for the transactions running then to end.
	w.gap(t, 2*time.Minute)

	var left bool
	if err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, leftover).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left {
		t.Fatalf("the publication %s a dead process left behind is still there", leftover)
	}
	pubTables := func(pub string) []string {
		t.Helper()
		rows, err := admin.Query(ctx, `SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1 ORDER BY 1`, pub)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return names
	}
	var pub string
	if err := admin.QueryRow(ctx, `SELECT pubname FROM pg_publication_tables WHERE schemaname = $1`, a.Schema).Scan(&pub); err != nil {
		t.Fatalf("the doorbell's publication: %v", err)
	}
	want := []string{a.Schema + ".millbox_outbox", a.Schema + ".millbox_outbox_scheduled", b.Schema + ".millbox_outbox", b.Schema + ".millbox_outbox_scheduled"}
	slices.Sort(want)
	if got := pubTables(pub); !slices.Equal(got, want) {
		t.Fatalf("publication %s lists %v, want %v", pub, got, want)
	}

	w.drain()
	committed := fleetPublish(t, db, da, fleetMessage(time.Time{}))
	t.Logf("slot doorbell: ring %v after the commit", w.ring(t, "a").Sub(committed).Round(time.Millisecond))
	committed = fleetPublish(t, db, dbB, fleetMessage(time.Now().Add(time.Hour)))
	t.Logf("slot doorbell: ring %v after the commit of a delayed message", w.ring(t, "b").Sub(committed).Round(time.Millisecond))

	w.setTenants(a, b, c)
	w.ring(t, "c")
	committed = fleetPublish(t, db, dc, fleetMessage(time.Time{}))
	t.Logf("slot doorbell: ring %v after the commit of a tenant added", w.ring(t, "c").Sub(committed).Round(time.Millisecond))

	// A tenant whose tables do not exist yet (the fleet migrates a new
	// tenant on first sight) joins once they do.
	d := fleet.Tenant{ID: "d", Schema: testenv.PostgresSchema(t, admin)}
	w.setTenants(a, b, c, d)
	time.Sleep(300 * time.Millisecond) // several looks at the tenants
	dd := postgres.MustNew(postgres.Options{WithoutInbox: true, Schema: d.Schema})
	if err := sqladapters.Migrate(ctx, db, dd); err != nil {
		t.Fatal(err)
	}
	w.ring(t, "d")
	committed = fleetPublish(t, db, dd, fleetMessage(time.Time{}))
	t.Logf("slot doorbell: ring %v after the commit of a tenant migrated while watched", w.ring(t, "d").Sub(committed).Round(time.Millisecond))

	w.setTenants(a, c, d)
	for deadline := time.Now().Add(fleetWait); ; time.Sleep(20 * time.Millisecond) {
		got := pubTables(pub)
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, b.Schema+".") }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("publication %s still lists %v %v after tenant b was removed", pub, got, fleetWait)
		}
	}

	w.end(t)
	var pubs, slots int
	if err := admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_publication WHERE pubname = $1), (SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1)`, pub).Scan(&pubs, &slots); err != nil {
		t.Fatal(err)
	}
	if pubs != 0 || slots != 0 {
		t.Fatalf("after Watch returned: %d publications and %d slots named %s, want none", pubs, slots, pub)
	}
	if n := budget.Open(); n != 0 {
		t.Fatalf("%d doorbell connections open after Watch returned", n)
	}
	conns.Stop()
}

// mysqlFleetSetup creates tenant databases holding the millbox tables
// (without the inbox) and a user of the test's own with every privilege
// on them, all dropped after the test. It returns the databases and the
// user's DSN, whose database is the first tenant's.
func mysqlFleetSetup(t *testing.T, root *sql.DB, tenants int) (dbs []string, user, dsn string) {
	t.Helper()
	ctx := testenv.Ctx(t, 2*time.Minute)
	user = testenv.UniqueName("fleet_")
	const password = "fleet-test"
	if _, err := root.ExecContext(ctx, `CREATE USER '`+user+`'@'%' IDENTIFIED BY '`+password+`'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = root.ExecContext(context.Background(), `DROP USER IF EXISTS '`+user+`'@'%'`) })
	for range tenants {
		name := testenv.UniqueName("fleet_")
		if _, err := root.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = root.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`") })
		if err := sqladapters.Migrate(ctx, stdsql.WrapDB(root), mysql.MustNew(mysql.Options{Database: name, WithoutInbox: true})); err != nil {
			t.Fatalf("migrate %s: %v", name, err)
		}
		if _, err := root.ExecContext(ctx, "GRANT ALL PRIVILEGES ON `"+name+"`.* TO '"+user+"'@'%'"); err != nil {
			t.Fatal(err)
		}
		dbs = append(dbs, name)
	}
	dsn = testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) {
		c.User, c.Passwd, c.DBName, c.ParseTime = user, password, dbs[0], true
	})
	return dbs, user, dsn
}

// mysqlClients lists the client ports of the server's connections of
// user.
func mysqlClients(root *sql.DB, user string) func(ctx context.Context) ([]int, error) {
	return func(ctx context.Context) ([]int, error) {
		rows, err := root.QueryContext(ctx, `SELECT HOST FROM information_schema.PROCESSLIST WHERE USER = ?`, user)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var ports []int
		for rows.Next() {
			var host string
			if err := rows.Scan(&host); err != nil {
				return nil, err
			}
			port := -1 // a socket connection: no port, never dialled by the fleet
			if i := strings.LastIndexByte(host, ':'); i >= 0 {
				if p, err := strconv.Atoi(host[i+1:]); err == nil {
					port = p
				}
			}
			ports = append(ports, port)
		}
		return ports, rows.Err()
	}
}

func mysqlBudget(root *sql.DB, limit int, user string) *testenv.Budget {
	list := mysqlClients(root, user)
	return testenv.NewBudget(limit, func(ctx context.Context, port int) (bool, error) {
		ports, err := list(ctx)
		return !slices.Contains(ports, port), err
	})
}

// TestFleetMySQLHandles checks mysqlfleet's handle: one handle serves
// every tenant database of the server (each tenant's dialect names its
// database); under a load that wants more connections than the budget
// gives, the server never has more than the budget nor one that did not
// go through its dial function; once idle, the handle closes them by
// itself.
func TestFleetMySQLHandles(t *testing.T) {
	root := testenv.MySQL(t)
	dbs, user, dsn := mysqlFleetSetup(t, root, 2)
	srv, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	budget := mysqlBudget(root, 2, user)
	conns := testenv.WatchServerConns(t, budget, mysqlClients(root, user))
	const idle = time.Second
	h, err := srv.Open(testenv.Ctx(t, time.Minute), "", budget.Dial, idle)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range dbs {
		d, err := srv.Dialect(fleet.Tenant{ID: name, Database: name})
		if err != nil {
			t.Fatal(err)
		}
		fleetPublish(t, h.DB(), d, fleetMessage(time.Time{}))
		var n int
		if err := root.QueryRow("SELECT COUNT(*) FROM `" + name + "`.millbox_outbox").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("tenant database %s holds %d rows after a publish through the server's handle, want 1", name, n)
		}
	}

	took := fleetWaitClosed(t, budget, mysqlClients(root, user))
	t.Logf("the idle handle closed its connections %v after the last query (idle %v)", took.Round(time.Millisecond), idle)

	// A query that waits for a place waits until a connection of the
	// handle is idle long enough to close.
	fleetLoad(t, `SELECT SLEEP(0.01)`, h.DB())
	took = fleetWaitClosed(t, budget, mysqlClients(root, user))
	t.Logf("after the load, %v", took.Round(time.Millisecond))
	seen, samples := conns.Stop()
	if seen == 0 || budget.Max() != budget.Limit() {
		t.Fatalf("the server listed at most %d connections in %d looks, the budget had at most %d open: the test did not load the handle", seen, samples, budget.Max())
	}
	t.Logf("the server listed at most %d connections in %d looks (budget %d)", seen, samples, budget.Limit())
}

// TestFleetMySQLDoorbell checks mysqlfleet's doorbell on two tenant
// databases: it rings each at first sight, then a tenant for a commit
// into its outbox and for one into its scheduled table, on one
// connection that goes through the doorbell's dial function.
func TestFleetMySQLDoorbell(t *testing.T) {
	root := testenv.MySQL(t)
	dbs, user, dsn := mysqlFleetSetup(t, root, 2)
	srv, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	budget := mysqlBudget(root, 1, user)
	conns := testenv.WatchServerConns(t, budget, mysqlClients(root, user))
	w := fleetWatch(t, srv.Doorbell(), budget.Dial, fleet.Tenant{ID: "a", Database: dbs[0]}, fleet.Tenant{ID: "b", Database: dbs[1]})
	w.ring(t, "a", "b") // at first sight

	writer := stdsql.WrapDB(root)
	w.drain()
	committed := fleetPublish(t, writer, mysql.MustNew(mysql.Options{Database: dbs[0], WithoutInbox: true}), fleetMessage(time.Time{}))
	t.Logf("MySQL doorbell: ring %v after the commit", w.ring(t, "a").Sub(committed).Round(time.Millisecond))
	committed = fleetPublish(t, writer, mysql.MustNew(mysql.Options{Database: dbs[1], WithoutInbox: true}), fleetMessage(time.Now().Add(time.Hour)))
	t.Logf("MySQL doorbell: ring %v after the commit of a delayed message", w.ring(t, "b").Sub(committed).Round(time.Millisecond))

	w.end(t)
	if n := budget.Open(); n != 0 {
		t.Fatalf("%d doorbell connections open after Watch returned", n)
	}
	if seen, _ := conns.Stop(); seen != 1 {
		t.Fatalf("the server listed at most %d doorbell connections, want 1", seen)
	}
}
