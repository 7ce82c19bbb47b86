package main

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// fleetEnv is a fleet's control tables in a schema of the test database,
// with tenants that are schemas (or databases) of the same server.
type fleetEnv struct {
	t      *testing.T
	ctx    context.Context
	pool   *pgxpool.Pool
	db     sqladapters.DB
	schema string // of the control tables
	store  sqladapters.FleetStore
}

func newFleetEnv(t *testing.T) *fleetEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, postgresURL())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	e := &fleetEnv{t: t, ctx: ctx, pool: pool, db: pgxv5.WrapPool(pool), schema: uniqueName("mbcli_fleet_")}
	e.dropLater(e.schema)
	e.store = postgres.MustNewFleet(postgres.FleetOptions{Schema: e.schema})
	return e
}

// dropLater drops a schema when the test ends.
func (e *fleetEnv) dropLater(schema string) {
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil {
			e.t.Logf("drop schema %s: %v", schema, err)
		}
	})
}

// tenant returns a tenant of server pg whose tables live in a new schema,
// created and migrated when migrate is set.
func (e *fleetEnv) tenant(id string, migrate bool) sqladapters.FleetTenant {
	e.t.Helper()
	schema := uniqueName("mbcli_tenant_")
	e.dropLater(schema)
	if migrate {
		if err := sqladapters.Migrate(e.ctx, e.db, postgres.MustNew(postgres.Options{Schema: schema})); err != nil {
			e.t.Fatal(err)
		}
	}
	return sqladapters.FleetTenant{ID: id, Server: "pg", Schema: schema}
}

// put writes tenants into the catalog.
func (e *fleetEnv) put(tenants ...sqladapters.FleetTenant) {
	e.t.Helper()
	if err := e.store.PutTenants(e.ctx, e.db, tenants); err != nil {
		e.t.Fatal(err)
	}
}

// publish commits n messages into a tenant's outbox.
func (e *fleetEnv) publish(tn sqladapters.FleetTenant, n int) {
	e.t.Helper()
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: postgres.MustNew(postgres.Options{Schema: tn.Schema})})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range n {
		if err := pub.Publish("orders", message.NewMessage(tn.ID+"-"+strconv.Itoa(i), []byte("{}"))); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := tx.Commit(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}

// cli is a fleet command's arguments with the control database's flags
// and the pg server's DSN.
func (e *fleetEnv) cli(args ...string) []string {
	return append(args, "--fleet", "--dsn", postgresURL(), "--fleet-schema", e.schema, "--server", "pg="+postgresURL())
}

// unreachableServer is a server nothing listens on, with a password that
// must never be printed.
const unreachableServer = "postgres://root:s3cretpw@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"

// status --fleet: every tenant of the catalog with the instance holding
// it and its backlog read from its own outbox, the largest backlog and
// the oldest pending message first, with totals; tenants that cannot be
// read are reported down with why, and the command still succeeds.
func TestFleetStatus(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t)
	mustRun(t, e.cli("migrate", "up")...) // the control tables, no tenants yet

	big, older, newer, empty := e.tenant("big", true), e.tenant("older", true), e.tenant("newer", true), e.tenant("empty", true)
	e.publish(older, 2)
	time.Sleep(300 * time.Millisecond) // older's messages wait longer than newer's
	e.publish(newer, 2)
	e.publish(big, 5)
	noTables := e.tenant("no-tables", false)
	unreachable := sqladapters.FleetTenant{ID: "unreachable", Server: "down"}
	unnamed := sqladapters.FleetTenant{ID: "unnamed", Server: "elsewhere"}
	e.put(big, older, newer, empty, noTables, unreachable, unnamed)

	// One live instance holding two tenants (claims go in ID order: big,
	// empty); the others wait for an instance.
	if _, err := e.store.Heartbeat(e.ctx, e.db, "instance-1", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.ClaimTenants(e.ctx, e.db, "instance-1", 2); err != nil {
		t.Fatal(err)
	}

	args := e.cli("status", "--server", "down="+unreachableServer, "--connect-timeout", "3s", "--parallel", "3")
	var st jsonFleetStatus
	runJSON(t, &st, args...)
	var order []string
	byID := map[string]jsonFleetTenant{}
	for _, tn := range st.Tenants {
		order = append(order, tn.ID)
		byID[tn.ID] = tn
	}
	if want := []string{"big", "older", "newer", "empty"}; !slices.Equal(order[:4], want) {
		t.Fatalf("order %v, want %v first (largest backlog, then oldest pending)", order, want)
	}
	if got := order[4:]; !slices.Equal(got, []string{"no-tables", "unnamed", "unreachable"}) {
		t.Fatalf("the tenants down come last, by ID: got %v", got)
	}
	if b := byID["big"]; b.Pending != 5 || b.Instance != "instance-1" || b.Down || b.Schema != big.Schema || b.Server != "pg" {
		t.Fatalf("big: %+v", b)
	}
	if o, n := byID["older"], byID["newer"]; o.Pending != 2 || o.Instance != "" || o.OldestPendingAgeSeconds <= n.OldestPendingAgeSeconds {
		t.Fatalf("older %+v, newer %+v", o, n)
	}
	for id, want := range map[string]string{
		"no-tables":   "millbox tables are missing",
		"unreachable": "cannot reach the database",
		"unnamed":     "--server elsewhere=DSN",
	} {
		if tn := byID[id]; !tn.Down || !strings.Contains(tn.Error, want) {
			t.Fatalf("%s: want down with %q, got %+v", id, want, tn)
		}
	}
	if want := (jsonFleetTotals{Tenants: 7, Instances: 1, Unowned: 5, Down: 3, Pending: 9, OldestPendingAgeSeconds: byID["older"].OldestPendingAgeSeconds}); st.Totals != want {
		t.Fatalf("totals %+v, want %+v", st.Totals, want)
	}
	if want := []jsonFleetInstance{{"instance-1", 2}}; !slices.Equal(st.Instances, want) {
		t.Fatalf("instances %+v, want %+v", st.Instances, want)
	}

	r := mustRun(t, args...)
	for _, want := range []string{"7 tenants, 1 instance live, 5 held by none, 3 down", "TENANT", "instance-1", "Down:", "unreachable (server down)"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("text output lacks %q: %s", want, r)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "s3cretpw") {
		t.Fatalf("a server's password was printed: %s", r)
	}
	if lines := strings.Split(r.stdout, "\n"); !strings.HasPrefix(lines[2], "big ") {
		t.Fatalf("the largest backlog is not the first row: %s", r)
	}

	// Without the control tables: an error saying how to create them.
	r = runCmd(t, "status", "--fleet", "--dsn", postgresURL(), "--fleet-schema", uniqueName("mbcli_none_"))
	if r.code != exitError || !strings.Contains(r.stderr, "control tables are missing") || !strings.Contains(r.stderr, "millbox migrate up --fleet") {
		t.Fatalf("missing control tables: %s", r)
	}
	// Fleet flags need --fleet, and --schema does not go with it.
	for _, args := range [][]string{
		{"status", "--server", "pg=" + postgresURL()},
		{"status", "--fleet", "--schema", "x"},
		{"status", "--fleet", "--server", "nodsn"},
		{"migrate", "up", "--tenants", "file"},
	} {
		if r := runCmd(t, args...); r.code != exitUsage {
			t.Fatalf("%v: want a usage error, got %s", args, r)
		}
	}
}

// migrate up --fleet: the control tables, then every tenant of the
// catalog (a schema, a database, one whose server is down), reported one
// by one, failing when one failed; run again, every tenant is up to date.
// With --tenants, the tenants of a file, without a control database.
func TestFleetMigrate(t *testing.T) {
	t.Parallel()
	e := newFleetEnv(t)
	mustRun(t, e.cli("migrate", "up")...)

	database := uniqueName("mbcli_tenantdb_")
	if _, err := e.pool.Exec(e.ctx, `CREATE DATABASE "`+database+`"`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.pool.Exec(ctx, `DROP DATABASE IF EXISTS "`+database+`" WITH (FORCE)`); err != nil {
			t.Logf("drop database %s: %v", database, err)
		}
	})
	var tenants []sqladapters.FleetTenant
	for i := range 4 {
		tenants = append(tenants, e.tenant("schema-"+strconv.Itoa(i), false))
	}
	inDatabase := sqladapters.FleetTenant{ID: "database", Server: "pg", Database: database}
	down := sqladapters.FleetTenant{ID: "down", Server: "down"}
	e.put(append(tenants, inDatabase, down)...)

	args := e.cli("migrate", "up", "--parallel", "2", "--connect-timeout", "3s", "--server", "down="+unreachableServer)
	r := runCmd(t, args...)
	if r.code != exitError || !strings.Contains(r.stderr, "1 of 6 tenants failed to migrate") {
		t.Fatalf("want exit 1 naming the failed tenant: %s", r)
	}
	for _, want := range []string{"fleet control tables", "up to date", "ok     schema-0: created", "ok     database: created",
		"error  down: cannot reach the database", "migrated 5 of 6 tenants; 1 failed"} {
		if !strings.Contains(r.stdout, want) {
			t.Fatalf("output lacks %q: %s", want, r)
		}
	}
	if strings.Contains(r.stdout+r.stderr, "s3cretpw") {
		t.Fatalf("a server's password was printed: %s", r)
	}
	// The tables are where the catalog says.
	for _, tn := range tenants {
		if _, err := postgres.MustNew(postgres.Options{Schema: tn.Schema}).AppliedMigrations(e.ctx, e.db); err != nil {
			t.Fatalf("tenant %s: %v", tn.ID, err)
		}
	}
	other, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	other.ConnConfig.Database = database
	dbPool, err := pgxpool.NewWithConfig(e.ctx, other)
	if err != nil {
		t.Fatal(err)
	}
	_, err = postgres.MustNew(postgres.Options{}).AppliedMigrations(e.ctx, pgxv5.WrapPool(dbPool))
	dbPool.Close()
	if err != nil {
		t.Fatalf("tenant database: %v", err)
	}

	// Without the tenant that is down: every tenant is up to date.
	if err := e.store.RemoveTenants(e.ctx, e.db, []string{down.ID}); err != nil {
		t.Fatal(err)
	}
	var out jsonFleetMigrate
	runJSON(t, &out, e.cli("migrate", "up")...)
	if out.OK != 5 || out.Failed != 0 || len(out.Tenants) != 5 {
		t.Fatalf("second migrate: %+v", out)
	}
	for _, tn := range out.Tenants {
		if !tn.OK || tn.Action != "up to date" || tn.Version == 0 {
			t.Fatalf("second migrate: %+v", tn)
		}
	}

	// A tenants file: its tenants, without the control database.
	a, b := e.tenant("file-a", false), e.tenant("file-b", false)
	file := filepath.Join(t.TempDir(), "tenants")
	body := "# id server database schema\n" + a.ID + " pg - " + a.Schema + "\n\n" + b.ID + "\tpg\t-\t" + b.Schema + "\n"
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, "migrate", "up", "--fleet", "--tenants", file, "--server", "pg="+postgresURL())
	if !strings.Contains(r.stdout, "ok     file-a: created") || !strings.Contains(r.stdout, "ok     file-b: created") || strings.Contains(r.stdout, "control tables") {
		t.Fatalf("migrate --tenants: %s", r)
	}
	if err := os.WriteFile(file, []byte("only-an-id\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := runCmd(t, "migrate", "up", "--fleet", "--tenants", file); r.code != exitUsage || !strings.Contains(r.stderr, file+":1") {
		t.Fatalf("a bad tenants file: want a usage error naming the line, got %s", r)
	}

	// migrate sql --fleet prints the control tables.
	if r := mustRun(t, "migrate", "sql", "--fleet", "--db", "postgres"); !strings.Contains(r.stdout, "millbox_fleet_tenants") {
		t.Fatalf("migrate sql --fleet: %s", r)
	}
}

// The servers' DSNs come from $MILLBOX_FLEET_SERVERS, one name=DSN a
// line, and --server overrides a name; both are masked in errors.
func TestFleetServers(t *testing.T) {
	environ := map[string]string{serversEnv: "# the servers\npg1=postgres://app:envpass@db1/app\n\n pg2 = host=db2 user=app password=kvpass \n"}
	e := env{getenv: func(k string) string { return environ[k] }}
	f := fleetFlags{servers: serverFlags{}}
	if err := f.servers.Set("pg2=postgres://app:flagpass@db2b/app"); err != nil {
		t.Fatal(err)
	}
	got, err := f.serverDSNs(e)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pg1": "postgres://app:envpass@db1/app", "pg2": "postgres://app:flagpass@db2b/app"}
	if len(got) != len(want) || got["pg1"] != want["pg1"] || got["pg2"] != want["pg2"] {
		t.Fatalf("servers %v, want %v", got, want)
	}
	for _, bad := range []string{"nodsn", "=postgres://x", "pg2=postgres://again"} {
		if err := f.servers.Set(bad); err == nil {
			t.Fatalf("--server %q accepted", bad)
		}
	}
	environ[serversEnv] = "no equals sign"
	if _, err := f.serverDSNs(e); err == nil {
		t.Fatal("a line without name=DSN accepted")
	}
	environ[serversEnv] = "pg1=postgres://app:envpass@db1/app\npg2=host=db2 user=app password=kvpass"
	hidden := dsnsIn([]string{"status", "--fleet", "--server", "x=postgres://u:flagpass1@h/d", "--server=y=postgres://u:flagpass2@h/d"}, e.getenv)
	var all []string
	for _, dsn := range hidden {
		all = append(all, secrets(dsn)...)
	}
	for _, p := range []string{"envpass", "kvpass", "flagpass1", "flagpass2"} {
		if !slices.Contains(all, p) {
			t.Fatalf("the password %s is not masked: %v", p, all)
		}
	}
}

// A fleet on MySQL/MariaDB: the control tables in the test database, a
// tenant in a database of its own, migrated and then reported.
func TestFleetMySQL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sqlDB, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() }) // after the cleanup below, which uses it
	if err := sqlDB.PingContext(ctx); err != nil {
		unavailable(t, "MySQL/MariaDB", err)
	}
	prefix, database := uniqueName("mbf_"), uniqueName("mbcli_tenantdb_")
	store := mysql.MustNewFleet(mysql.FleetOptions{Prefix: prefix})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, q := range append(mapTables(store.Tables()), "DROP DATABASE IF EXISTS `"+database+"`") {
			if _, err := sqlDB.ExecContext(ctx, q); err != nil {
				t.Logf("%s: %v", q, err)
			}
		}
	})
	cli := func(args ...string) []string {
		return append(args, "--fleet", "--dsn", mysqlDSN(), "--fleet-prefix", prefix, "--server", "my="+mysqlDSN())
	}
	mustRun(t, cli("migrate", "up")...)
	if err := store.PutTenants(ctx, stdsql.WrapDB(sqlDB), []sqladapters.FleetTenant{{ID: "acme", Server: "my", Database: database}}); err != nil {
		t.Fatal(err)
	}
	if r := mustRun(t, cli("migrate", "up")...); !strings.Contains(r.stdout, "ok     acme: created") {
		t.Fatalf("migrate up --fleet: %s", r)
	}
	var st jsonFleetStatus
	runJSON(t, &st, cli("status")...)
	if len(st.Tenants) != 1 || st.Tenants[0].Down || st.Tenants[0].Database != database {
		t.Fatalf("status --fleet: %+v", st)
	}
}

// mapTables turns quoted table names into DROP TABLE statements.
func mapTables(tables []string) []string {
	out := make([]string, len(tables))
	for i, table := range tables {
		out[i] = "DROP TABLE IF EXISTS " + table
	}
	return out
}
