package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
)

// The fleet mode of status and migrate works on the tenants of a
// forwarder fleet (package forwarder/fleet): --dsn names the control
// database, whose catalog lists the tenants by server name, and the
// servers' connection strings come from --server flags or from
// $MILLBOX_FLEET_SERVERS, since the catalog never holds one.

// serversEnv holds the tenant servers' DSNs, one name=DSN per line: the
// way to keep their passwords off the command line.
const serversEnv = "MILLBOX_FLEET_SERVERS"

// defaultParallel is how many tenants a fleet command visits at once.
const defaultParallel = 8

// fleetFlags are the flags of the fleet mode.
type fleetFlags struct {
	on       bool
	schema   string // the control tables' schema (PostgreSQL) or database (MySQL)
	prefix   string
	servers  serverFlags
	parallel int
}

func (f *fleetFlags) register(fs *flag.FlagSet) {
	f.servers = serverFlags{}
	fs.BoolVar(&f.on, "fleet", false, "act on every tenant of a forwarder fleet: --dsn is the control database, whose catalog lists them")
	fs.StringVar(&f.schema, "fleet-schema", "", "with --fleet: Postgres schema or MySQL database of the fleet's control tables (FleetOptions; default: the connection's)")
	fs.StringVar(&f.prefix, "fleet-prefix", "", "with --fleet: prefix of the control tables' names (FleetOptions.Prefix; default millbox_fleet)")
	fs.Var(f.servers, "server", "with --fleet: `name=DSN` of a server the catalog names, repeated once per server (also $"+serversEnv+", one name=DSN per line)")
	fs.IntVar(&f.parallel, "parallel", defaultParallel, "with --fleet: how many tenants to visit at once")
}

// check refuses the fleet flags without --fleet, and --schema with it:
// the catalog gives every tenant's schema.
func (f *fleetFlags) check(c *common) error {
	if !f.on {
		for _, name := range []string{"fleet-schema", "fleet-prefix", "server", "parallel"} {
			if c.set(name) {
				return usagef("--%s needs --fleet", name)
			}
		}
		return nil
	}
	if c.set("schema") {
		return usagef("--schema does not apply with --fleet: each tenant's schema comes from the catalog; --fleet-schema names the control tables' schema")
	}
	if f.parallel < 1 {
		return usagef("--parallel must be at least 1, got %d", f.parallel)
	}
	return nil
}

// serverFlags is the --server flag: server name to DSN.
type serverFlags map[string]string

func (s serverFlags) String() string { return "" }

func (s serverFlags) Set(v string) error {
	name, dsn, ok := strings.Cut(v, "=")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.TrimSpace(dsn) == "" {
		return errors.New("want name=DSN, such as pg1=postgres://app@db1:5432/app")
	}
	if _, dup := s[name]; dup {
		return fmt.Errorf("server %q given twice", name)
	}
	s[name] = dsn
	return nil
}

// serverDSNs returns the servers' DSNs: those of $MILLBOX_FLEET_SERVERS,
// overridden by the --server flags.
func (f *fleetFlags) serverDSNs(e env) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(e.getenv(serversEnv), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, dsn, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return nil, usagef("$%s line %d: want name=DSN", serversEnv, i+1)
		}
		out[strings.TrimSpace(name)] = dsn
	}
	for name, dsn := range f.servers {
		out[name] = dsn
	}
	return out, nil
}

// fleetStore builds the store of the control tables for the control
// database's kind.
func (f *fleetFlags) store(kind string) (sqladapters.FleetStore, error) {
	switch kind {
	case "postgres":
		return postgres.NewFleet(postgres.FleetOptions{Schema: f.schema, Prefix: f.prefix})
	case "mysql":
		return mysql.NewFleet(mysql.FleetOptions{Database: f.schema, Prefix: f.prefix})
	case "sqlite":
		if f.schema != "" {
			return nil, errors.New("--fleet-schema does not apply to SQLite: one file is one database")
		}
		return sqlite.NewFleet(sqlite.FleetOptions{Prefix: f.prefix})
	}
	return nil, fmt.Errorf("unknown database %q", kind)
}

// control is the open control database and its store.
type control struct {
	*conn
	t     target
	store sqladapters.FleetStore
}

// openControl connects to the control database of --dsn.
func (f *fleetFlags) openControl(ctx context.Context, e env, c *common) (*control, error) {
	dsn := c.dsn
	if dsn == "" {
		dsn = e.getenv("MILLBOX_DSN")
	}
	t, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	store, err := f.store(t.kind)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	cn, err := c.open(ctx, t, false)
	if err != nil {
		return nil, err
	}
	return &control{conn: cn, t: t, store: store}, nil
}

// tables describes the control tables for messages: their common name
// with a *, where.
func (c *control) tables() string {
	name := unquote(c.store.Tables()[0])
	name = name[:strings.LastIndexByte(name, '_')+1] + "*"
	return fmt.Sprintf("control tables %s in %s at %s", name, c.t.kind, c.t.where)
}

// explain turns missing control tables into what to do.
func (c *control) explain(err error, cm *common) error {
	var mt *sqladapters.MissingTableError
	if errors.As(err, &mt) {
		return &tablesMissingError{err: err, msg: fmt.Sprintf("the fleet's control tables are missing (looked for %s in %s at %s)\n"+
			"create them with sqladapters.MigrateFleet, or with: %s\n(%v)",
			unquote(c.store.Tables()[0]), c.t.kind, c.t.where, cm.fleetHint("migrate up --fleet"), mt.Err)}
	}
	return err
}

// fleetHint is hint for a fleet command: the --server flags are not
// repeated, since their DSNs may hold passwords.
func (c *common) fleetHint(command string) string {
	h := c.hint(command)
	if c.set("server") {
		h += " (with your --server flags)"
	}
	return h
}

// tenantDBs opens the tenants' databases, one pool per database of a
// server (tenants that are schemas of one database share it; MySQL
// tenants share their server's), and closes them all at the end.
type tenantDBs struct {
	c       *common
	tables  tableFlags
	servers map[string]string // name to DSN
	secrets []string          // the servers' passwords, masked in errors

	mu    sync.Mutex
	pools map[string]*poolEntry
}

type poolEntry struct {
	once sync.Once
	cn   *conn
	err  error
}

func newTenantDBs(c *common, servers map[string]string) *tenantDBs {
	d := &tenantDBs{c: c, tables: c.tables, servers: servers, pools: map[string]*poolEntry{}}
	for _, dsn := range servers {
		d.secrets = append(d.secrets, secrets(dsn)...)
	}
	slices.SortFunc(d.secrets, func(a, b string) int { return len(b) - len(a) })
	return d
}

// errNoServer marks a tenant whose server has no DSN given.
var errNoServer = errors.New("no DSN for the tenant's server")

// open returns the database and dialect of tenant t.
func (d *tenantDBs) open(ctx context.Context, t sqladapters.FleetTenant) (sqladapters.DB, sqladapters.Dialect, error) {
	dsn, ok := d.servers[t.Server]
	if !ok {
		return nil, nil, fmt.Errorf("%w: pass --server %s=DSN or add it to $%s", errNoServer, shellQuote(t.Server), serversEnv)
	}
	tg, err := parseDSN(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("the DSN of server %q: %w", t.Server, err)
	}
	tables := d.tables
	key := t.Server
	switch tg.kind {
	case "postgres":
		// A tenant's database replaces the server DSN's; its schema holds
		// the tables.
		if t.Database != "" {
			cfg := tg.pg.Copy()
			cfg.ConnConfig.Database = t.Database
			tg.pg = cfg
			tg.where = tg.where[:strings.LastIndexByte(tg.where, '/')+1] + t.Database
		}
		key += "\x00" + tg.pg.ConnConfig.Database
		tables.schema = t.Schema
	case "mysql":
		// One connection reaches every database of a MySQL server: the
		// dialect names the tenant's.
		tables.schema = t.Database
		if tables.schema == "" {
			tables.schema = tg.my.DBName
		}
	case "sqlite":
		// A SQLite tenant's database is its file.
		if t.Database != "" {
			tg.path, tg.where = t.Database, t.Database
		}
		key += "\x00" + tg.path
	}
	dialect, err := tables.dialect(tg.kind)
	if err != nil {
		return nil, nil, err
	}
	d.mu.Lock()
	p := d.pools[key]
	if p == nil {
		p = &poolEntry{}
		d.pools[key] = p
	}
	d.mu.Unlock()
	p.once.Do(func() { p.cn, p.err = d.c.open(ctx, tg, false) })
	if p.err != nil {
		return nil, nil, p.err
	}
	return p.cn.db, dialect, nil
}

// redact masks the servers' passwords in an error's text: driver errors
// are shown per tenant on standard output.
func (d *tenantDBs) redact(err error) string {
	return redact(errorText(err), d.secrets)
}

func (d *tenantDBs) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.pools {
		if p.cn != nil {
			p.cn.close()
		}
	}
}

// forEach runs fn for every tenant, at most parallel at once, and waits.
func forEach(tenants []sqladapters.FleetTenant, parallel int, fn func(i int, t sqladapters.FleetTenant)) {
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, t := range tenants {
		// Once ctx ended the rest are still visited, each failing at
		// once with ctx's error, so that every tenant is reported.
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			fn(i, t)
		})
	}
	wg.Wait()
}

// readTenantsFile reads a list of tenants: one a line, its ID, server,
// database and schema separated by blanks, the last two optional ("-"
// for none); blank lines and lines starting with # are skipped.
func readTenantsFile(path string) ([]sqladapters.FleetTenant, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []sqladapters.FleetTenant
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 || len(fields) > 4 {
			return nil, fmt.Errorf("%s:%d: want ID SERVER [DATABASE [SCHEMA]], got %d fields", path, n, len(fields))
		}
		fields = append(fields, "-", "-")
		none := func(s string) string {
			if s == "-" {
				return ""
			}
			return s
		}
		t := sqladapters.FleetTenant{ID: fields[0], Server: fields[1], Database: none(fields[2]), Schema: none(fields[3])}
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if seen[t.ID] {
			return nil, fmt.Errorf("%s:%d: tenant %q is listed twice", path, n, t.ID)
		}
		seen[t.ID] = true
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}
