// Fleet forwards the outboxes of many tenants — some with a database of
// their own, some with a schema of a shared database — to Kafka from two
// instances of one deployment (package forwarder/fleet). The instances
// share the tenants by leases in a control database; tenants are
// registered while the instances run, one more is added half way, and
// then one instance stops: the other takes its tenants over, and every
// key's events still arrive in commit order.
//
//	go run ./examples/fleet
//	go run ./examples/fleet -n 10000 -tenants 10 -kafka localhost:9092 -postgres 'postgres://user@localhost:5432/app'
//
// PostgreSQL comes from -postgres, else $MILLBOX_POSTGRES_URL, else
// postgres://root@127.0.0.1:5432/test?sslmode=disable; the role must be
// allowed to create databases, and the schema tenants' doorbell (a logical
// replication slot) needs wal_level = logical and the REPLICATION
// attribute. Kafka runs in process (franz-go's kfake) unless -kafka names
// brokers. The tenant databases, the tenant schemas and the schema of the
// control tables are dropped at the end. The last line is a summary such
// as:
//
//	tenants=6 published=1000 received=1000 in_order=true took_over=true ok=true
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The two servers of the fleet, by the names the catalog stores. Both are
// the same PostgreSQL here; what differs is how a tenant lives on it, and
// so which doorbell tells the fleet that the tenant wrote.
const (
	databasesServer = "pg-databases" // a database per tenant
	schemasServer   = "pg-schemas"   // a schema per tenant, in one database
)

// keysPerTenant is the number of ordering keys (accounts) of each tenant.
const keysPerTenant = 4

func main() {
	pgURL := flag.String("postgres", exampleenv.PostgresURL(), "PostgreSQL `URL`")
	brokers := flag.String("kafka", "", "comma-separated Kafka `brokers` (default: an in-process Kafka)")
	n := flag.Int("n", 1000, "number of events to publish over all tenants, one transaction each")
	tenants := flag.Int("tenants", 6, "number of tenants, half of them databases and half schemas; the last is added while the fleet runs")
	flag.Parse()
	if err := run(*pgURL, *brokers, max(*n, 3), max(*tenants, 2)); err != nil {
		fmt.Fprintln(os.Stderr, "fleet:", err)
		os.Exit(1)
	}
}

// tenant is one tenant as the application knows it: its catalog entry,
// and the pool its own code writes through.
type tenant struct {
	fleet.Tenant
	pool   *pgxpool.Pool
	outbox *forwarder.Publisher // writes into the tenant's outbox in a transaction
	next   map[string]int       // the next seq of each key
	events int                  // published so far
}

func run(pgURL, brokers string, n, tenantCount int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cleanupCtx := context.WithoutCancel(ctx)
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	prefix := "millbox_example_fleet_" + suffix

	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()

	// The control tables (members, the catalog of tenants, who holds
	// each) live in a database the application already runs; here, a
	// schema of the example's database.
	control := pgxv5.WrapPool(pool)
	store, err := postgres.NewFleet(postgres.FleetOptions{Schema: prefix + "_control"})
	if err != nil {
		return err
	}
	defer pool.Exec(cleanupCtx, `DROP SCHEMA IF EXISTS "`+prefix+`_control" CASCADE`)
	if err := sqladapters.MigrateFleet(ctx, control, store); err != nil {
		return err
	}

	// Provision the tenants as an application does when one signs up:
	// create its database or schema and the millbox tables in it.
	var tenants []*tenant
	defer func() {
		for _, t := range tenants {
			dropTenant(cleanupCtx, pool, t)
		}
	}()
	for i := range tenantCount {
		t, err := createTenant(ctx, pool, pgURL, prefix, i)
		if t != nil {
			tenants = append(tenants, t)
		}
		if err != nil {
			return err
		}
	}
	fmt.Printf("created %d tenants: %s\n", len(tenants), ids(tenants))

	addrs, stopKafka, err := exampleenv.StartKafka(brokers)
	if err != nil {
		return err
	}
	topic, group := "tenant-events."+suffix, "example-reader-"+suffix
	defer stopKafka([]string{topic}, []string{group})
	// kafkabatch makes the ordering key the Kafka record key: one key,
	// one partition.
	pub, err := kafkabatch.NewPublisher(kafkabatch.Config{Brokers: addrs})
	if err != nil {
		return err
	}
	defer pub.Close()
	sub, err := exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
		Brokers: addrs, ConsumerGroup: group, Topics: []string{topic}, Partitions: 6,
	})
	if err != nil {
		return err
	}
	defer sub.Close()

	// Every instance runs the same configuration, but for its name. The
	// short lease and hold times make the example quick; the defaults
	// suit production.
	cfg := fleet.Config{
		Control:         control,
		Store:           store,
		Destination:     pub,
		CatalogInterval: 100 * time.Millisecond,
		LeaseTTL:        3 * time.Second,
		MinHold:         200 * time.Millisecond,
		MaxHold:         2 * time.Second,
		Logger: watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr,
			&slog.HandlerOptions{Level: slog.LevelWarn}))),
	}
	a, stopA, err := startInstance(ctx, cfg, pgURL, "instance-a-"+suffix)
	if err != nil {
		return err
	}
	defer stopA()
	b, stopB, err := startInstance(ctx, cfg, pgURL, "instance-b-"+suffix)
	if err != nil {
		return err
	}
	defer stopB()

	// Register the tenants at run time: the catalog is a table, and any
	// instance (or the application's sign-up code, through the store)
	// writes it. Every instance sees the change within CatalogInterval.
	initial, late := tenants[:len(tenants)-1], tenants[len(tenants)-1]
	if err := a.PutTenants(ctx, specs(initial)...); err != nil {
		return err
	}
	if err := waitHeld(ctx, len(initial), a, b); err != nil {
		return err
	}
	printHeld(ctx, "registered", a, b)

	start := time.Now()
	active := initial
	var tookOver bool
	var heldByA []string
	for i := range n {
		switch i {
		case n / 3:
			// A tenant signs up while the fleet runs: it is forwarded
			// without a restart.
			if err := b.PutTenants(ctx, late.Tenant); err != nil {
				return err
			}
			active = tenants
			if err := waitHeld(ctx, len(tenants), a, b); err != nil {
				return err
			}
			printHeld(ctx, "added "+late.ID, a, b)
		case 2 * n / 3:
			// Instance a stops (a deploy, a scale-down): it finishes its
			// calls and leaves the members, so b takes its tenants at
			// once rather than after LeaseTTL.
			heldByA = held(ctx, a)
			stopA()
			if err := waitHeld(ctx, len(tenants), b); err != nil {
				return err
			}
			nowB := held(ctx, b)
			tookOver = len(heldByA) > 0
			for _, id := range heldByA {
				tookOver = tookOver && slices.Contains(nowB, id)
			}
			fmt.Printf("stopped instance a after %d events; b took over %s and holds %d tenants\n", i, strings.Join(heldByA, ", "), len(nowB))
		}
		t := active[i%len(active)]
		if err := t.publish(ctx, topic, i); err != nil {
			return err
		}
	}
	fmt.Printf("committed %d events in %v\n", n, time.Since(start).Round(time.Millisecond))

	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	nextSeq := map[string]int{}
	inOrder := true
	for len(seen) < n {
		var msg *message.Message
		select {
		case msg = <-msgs:
		case <-ctx.Done():
			return fmt.Errorf("received %d of %d events: %w", len(seen), n, ctx.Err())
		}
		msg.Ack()
		if seen[msg.UUID] {
			continue // at least once: a takeover may send a few events again
		}
		seen[msg.UUID] = true
		key := msg.Metadata.Get(forwarder.DefaultKeyMetadataField)
		seq, _ := strconv.Atoi(msg.Metadata.Get("seq"))
		if seq != nextSeq[key] {
			inOrder = false
			fmt.Printf("%s: seq %d arrived, expected %d\n", key, seq, nextSeq[key])
		}
		nextSeq[key] = seq + 1
	}
	fmt.Printf("forwarded and read back %d events of %d keys in %v\n", n, len(nextSeq), time.Since(start).Round(time.Millisecond))
	ok := inOrder && tookOver
	fmt.Printf("tenants=%d published=%d received=%d in_order=%t took_over=%t ok=%t\n", len(tenants), n, len(seen), inOrder, tookOver, ok)
	if !ok {
		return errors.New("check failed")
	}
	return nil
}

// createTenant creates tenant i: a database of its own for even i, a
// schema of the example's database for odd i, with the millbox tables.
// It returns the tenant as soon as something was created, so that it is
// dropped even when a later step fails.
func createTenant(ctx context.Context, pool *pgxpool.Pool, pgURL, prefix string, i int) (*tenant, error) {
	name := prefix + "_t" + strconv.Itoa(i)
	t := &tenant{Tenant: fleet.Tenant{ID: "tenant-" + strconv.Itoa(i)}, next: map[string]int{}}
	opts := postgres.Options{WithoutInbox: true}
	if i%2 == 0 {
		if _, err := pool.Exec(ctx, `CREATE DATABASE "`+name+`"`); err != nil {
			return nil, fmt.Errorf("create database %s: %w", name, err)
		}
		t.Server, t.Database = databasesServer, name
		cfg, err := pgxpool.ParseConfig(pgURL)
		if err != nil {
			return t, err
		}
		cfg.ConnConfig.Database = name
		if t.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
			return t, err
		}
		// The stat doorbell sees a commit once the session reported its
		// counters: FlushStats makes every outbox insert report them at
		// once, instead of up to ten seconds later.
		opts.FlushStats = true
	} else {
		t.Server, t.Schema, t.pool = schemasServer, name, pool
		opts.Schema = name
	}
	dialect, err := postgres.New(opts)
	if err != nil {
		return t, err
	}
	if t.outbox, err = forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect}); err != nil {
		return t, err
	}
	return t, sqladapters.Migrate(ctx, pgxv5.WrapPool(t.pool), dialect)
}

// dropTenant drops what createTenant created. A database is dropped WITH
// (FORCE), which ends the sessions still open on it.
func dropTenant(ctx context.Context, pool *pgxpool.Pool, t *tenant) {
	var err error
	if t.Database != "" {
		if t.pool != nil {
			t.pool.Close()
		}
		_, err = pool.Exec(ctx, `DROP DATABASE IF EXISTS "`+t.Database+`" WITH (FORCE)`)
	} else {
		_, err = pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+t.Schema+`" CASCADE`)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cleanup: tenant %s: %v\n", t.ID, err)
	}
}

// publish commits event i of the tenant in the tenant's own transaction,
// on the tenant's database: an application writes its business rows in
// the same transaction. The key is the tenant's account, so order is kept
// per account of each tenant.
func (t *tenant) publish(ctx context.Context, topic string, i int) error {
	key := t.ID + "/account-" + strconv.Itoa(t.events%keysPerTenant)
	t.events++
	msg := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"tenant":%q,"n":%d}`, t.ID, i))
	msg.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
	msg.Metadata.Set("seq", strconv.Itoa(t.next[key]))
	t.next[key]++
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if err := t.outbox.PublishTx(ctx, pgxv5.WrapTx(tx), topic, msg); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// startInstance runs one fleet instance in the background until its stop
// function is called, and waits until it serves.
func startInstance(ctx context.Context, cfg fleet.Config, pgURL, name string) (*fleet.Fleet, func(), error) {
	cfg.InstanceID = name
	servers, err := newServers(pgURL)
	if err != nil {
		return nil, nil, err
	}
	cfg.Servers = servers
	f, err := fleet.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	if err := f.Ready(ctx); err != nil {
		return nil, nil, fmt.Errorf("fleet instance %s: %w", name, err)
	}
	stopped := false
	return f, func() {
		if stopped {
			return
		}
		stopped = true
		if err := f.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "fleet instance %s: close: %v\n", name, err)
		}
		if err := <-done; err != nil && !errors.Is(err, forwarder.ErrClosed) {
			fmt.Fprintf(os.Stderr, "fleet instance %s: %v\n", name, err)
		}
	}, nil
}

// newServers returns the servers tenants live on, for one instance: a
// Server runs its doorbell for the instance it serves, so every instance
// builds its own (here two instances share a process; usually each is a
// process of its own). The catalog names a server, never a connection
// string: each instance resolves the name from its own configuration.
// Tenants with a database of their own are woken by the insert counters
// of pg_stat_database; tenants that are schemas of one database by a
// logical replication slot on that database.
func newServers(pgURL string) (map[string]fleet.Server, error) {
	servers := map[string]fleet.Server{}
	for name, bell := range map[string]pgfleet.DoorbellKind{databasesServer: pgfleet.StatDoorbell, schemasServer: pgfleet.SlotDoorbell} {
		s, err := pgfleet.NewServer(pgfleet.ServerConfig{
			DSN: pgURL, Doorbell: bell, ApplicationName: "millbox_example_fleet",
			// The tenants only publish: their tables have no inbox.
			Options: postgres.Options{WithoutInbox: true},
		})
		if err != nil {
			return nil, err
		}
		servers[name] = s
	}
	return servers, nil
}

// held returns the IDs of the tenants an instance holds.
func held(ctx context.Context, f *fleet.Fleet) []string {
	st, _ := f.Status(ctx)
	var out []string
	for _, t := range st.Tenants {
		out = append(out, t.ID)
	}
	slices.Sort(out)
	return out
}

// waitHeld waits until the instances hold want tenants together, each of
// them at least one: shares go by rank among the live members.
func waitHeld(ctx context.Context, want int, instances ...*fleet.Fleet) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		total, each := 0, true
		for _, f := range instances {
			h := len(held(ctx, f))
			total += h
			each = each && h > 0
		}
		if total == want && each {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the instances hold %d tenants after 30s, want %d", total, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func printHeld(ctx context.Context, what string, a, b *fleet.Fleet) {
	fmt.Printf("%s: instance a holds %s; instance b holds %s\n", what, strings.Join(held(ctx, a), ", "), strings.Join(held(ctx, b), ", "))
}

func specs(ts []*tenant) []fleet.Tenant {
	out := make([]fleet.Tenant, len(ts))
	for i, t := range ts {
		out[i] = t.Tenant
	}
	return out
}

func ids(ts []*tenant) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.ID
	}
	return strings.Join(out, ", ")
}
