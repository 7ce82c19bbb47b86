package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Fleet instances as processes of their own, so that they can be killed
// and frozen for real: the test binary runs one when fleetChildEnv is
// set (see TestMain). Each publishes into a table of the test database,
// which the test reads: what arrived, in which order, from which
// instance.

// fleetChildEnv holds the JSON of a fleetChildConfig: TestMain runs
// fleetChild instead of the tests when it is set.
const fleetChildEnv = "MILLBOX_FLEET_CHILD"

// fleetLeaseTTL is the lease of the instances the tests kill and freeze:
// short, so that their tenants move soon.
const fleetLeaseTTL = 2 * time.Second

type fleetChildConfig struct {
	Schema   string // of the control tables and the results table
	Instance string
}

// fleetChild runs one fleet instance until SIGTERM (or SIGKILL).
func fleetChild() error {
	var c fleetChildConfig
	if err := json.Unmarshal([]byte(os.Getenv(fleetChildEnv)), &c); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	// No doorbell: the tenants are looked at when they are taken and
	// every second, and stay hot while messages flow.
	srv, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: testenv.PostgresURL(), Doorbell: pgfleet.NoDoorbell, ApplicationName: c.Instance})
	if err != nil {
		return err
	}
	fl, err := fleet.New(fleet.Config{
		Control:         pgxv5.WrapPool(pool),
		Store:           postgres.MustNewFleet(postgres.FleetOptions{Schema: c.Schema}),
		Servers:         map[string]fleet.Server{"pg": srv},
		Destination:     &fleetResults{pool: pool, table: pgx.Identifier{c.Schema, "fleet_results"}.Sanitize(), instance: c.Instance},
		InstanceID:      c.Instance,
		CatalogInterval: 100 * time.Millisecond,
		LeaseTTL:        fleetLeaseTTL,
		SweepInterval:   time.Second,
		MinHold:         200 * time.Millisecond,
		MaxHold:         time.Second,
		Logger:          watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		Forwarder:       forwarder.Config{Retry: forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 200 * time.Millisecond}},
	})
	if err != nil {
		return err
	}
	return fl.Run(ctx)
}

// fleetResults is the child's destination: a row per message published,
// in the order of the calls, naming the instance that published it, the
// call (numbered in the instance) and when the call started (by the
// machine's clock, which the test shares).
type fleetResults struct {
	pool     *pgxpool.Pool
	table    string
	instance string
	calls    atomic.Int64
}

func (r *fleetResults) Publish(_ string, msgs ...*message.Message) error {
	started, call := time.Now(), r.calls.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := &pgx.Batch{}
	for _, m := range msgs {
		seq, err := strconv.Atoi(m.Metadata.Get("seq"))
		if err != nil {
			return fmt.Errorf("message %s without seq", m.UUID)
		}
		b.Queue(`INSERT INTO `+r.table+` (uuid, tenant, key, seq, instance, call, started) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			m.UUID, m.Metadata.Get("tenant"), m.Metadata.Get(forwarder.DefaultKeyMetadataField), seq, r.instance, call, started)
	}
	// One implicit transaction: the rows of a call commit together and
	// in the order of the messages.
	return r.pool.SendBatch(ctx, b).Close()
}

func (r *fleetResults) Close() error { return nil }

// fleetResult is a row of the results table.
type fleetResult struct {
	ID       int64
	UUID     string
	Tenant   string
	Key      string
	Seq      int
	Instance string
	Call     int64
	Started  time.Time
}

// results reads the results table in the order the rows were written.
func (e *fleetEnv) results(ctx context.Context) ([]fleetResult, error) {
	rows, err := e.pool.Query(ctx, `SELECT id, uuid, tenant, key, seq, instance, call, started FROM `+pgx.Identifier{e.schema, "fleet_results"}.Sanitize()+` ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[fleetResult])
}

// child starts a fleet instance process named instance, stopped with
// SIGTERM (or SIGKILL, if it is frozen or slow) after the test.
func (e *fleetEnv) child(instance string) *exec.Cmd {
	e.t.Helper()
	cfg, err := json.Marshal(fleetChildConfig{Schema: e.schema, Instance: instance})
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(cfg))
	out := testenv.LogWriter(e.t, instance+": ")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	e.t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	return cmd
}

// TestFleetInstanceKilled kills one of two fleet instance processes with
// SIGKILL while messages of four tenants flow: its tenants are served by
// the other after the lease time, and every message arrives, each key's
// first arrivals in order (a message may arrive twice: at least once).
func TestFleetInstanceKilled(t *testing.T) { testFleetInstanceFault(t, syscall.SIGKILL) }

// TestFleetInstanceFrozen freezes one of two fleet instance processes
// with SIGSTOP while messages flow: its tenants are served by the other
// after the lease time; once thawed (SIGCONT), it publishes nothing of a
// tenant it lost out of order, claims its share again, and every message
// arrives, each key's first arrivals in order.
func TestFleetInstanceFrozen(t *testing.T) { testFleetInstanceFault(t, syscall.SIGSTOP) }

func testFleetInstanceFault(t *testing.T, sig syscall.Signal) {
	e := newFleetEnv(t)
	ctx := testenv.Ctx(t, 2*time.Minute)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{e.schema, "fleet_results"}.Sanitize()+
		` (id bigserial PRIMARY KEY, uuid text NOT NULL, tenant text NOT NULL, key text NOT NULL, seq int NOT NULL, instance text NOT NULL, call bigint NOT NULL, started timestamptz NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	var tenants []fleet.Tenant
	var rows []sqladapters.FleetTenant
	for range 4 {
		tn := e.tenantSchema("pg")
		tenants = append(tenants, tn)
		rows = append(rows, sqladapters.FleetTenant{ID: tn.ID, Server: tn.Server, Schema: tn.Schema})
	}
	if err := e.store.PutTenants(ctx, e.control, rows); err != nil {
		t.Fatal(err)
	}
	// Shares go by rank of name: a holds the first share.
	nameA, nameB := "a-"+e.app, "b-"+e.app
	a := e.child(nameA)
	e.child(nameB)

	// The writer commits a message to a key of every tenant in turn, each
	// key's seq growing, until stopped.
	stop := make(chan struct{})
	var written sync.Map // tenant ID → messages written
	writeErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			for _, tn := range tenants {
				if err := e.tryPublish(tn, "k"+strconv.Itoa(i%3), i, 1); err != nil {
					writeErr <- err
					return
				}
				written.Store(tn.ID, i+1)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	stopWriting := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
		select {
		case err := <-writeErr:
			t.Fatalf("writing: %v", err)
		default:
		}
	})
	t.Cleanup(stopWriting)

	// byInstance returns, from the rows after id from, the tenants each
	// instance published, and the last row's id.
	byInstance := func(from int64) (map[string]map[string]bool, int64, error) {
		res, err := e.results(ctx)
		if err != nil {
			return nil, 0, err
		}
		by := map[string]map[string]bool{}
		last := int64(0)
		for _, r := range res {
			last = r.ID
			if r.ID <= from {
				continue
			}
			if by[r.Instance] == nil {
				by[r.Instance] = map[string]bool{}
			}
			by[r.Instance][r.Tenant] = true
		}
		return by, last, nil
	}
	// Both instances hold their shares, two tenants each (the first to
	// start may have held all four for a moment), and publish for them.
	owned := map[string]map[string]bool{} // instance → tenant IDs
	fleetUntil(t, "each instance holds two tenants", func() (bool, error) {
		all, err := e.store.Tenants(ctx, e.control)
		owned = map[string]map[string]bool{}
		for _, tn := range all {
			if owned[tn.Owner] == nil {
				owned[tn.Owner] = map[string]bool{}
			}
			owned[tn.Owner][tn.ID] = true
		}
		return len(owned[nameA]) == 2 && len(owned[nameB]) == 2, err
	})
	aTenants := owned[nameA]
	_, held, err := byInstance(0)
	if err != nil {
		t.Fatal(err)
	}
	fleetUntil(t, "each instance publishes for its tenants", func() (bool, error) {
		by, _, err := byInstance(held)
		for inst, ids := range owned {
			for id := range ids {
				if !by[inst][id] {
					return false, err
				}
			}
		}
		return true, err
	})
	_, mark, err := byInstance(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	signalled := time.Now()
	fleetUntil(t, "the other instance publishes for the tenants of the one signalled", func() (bool, error) {
		by, _, err := byInstance(mark)
		for id := range aTenants {
			if !by[nameB][id] {
				return false, err
			}
		}
		return true, err
	})
	t.Logf("%v after %v, instance b published for the tenants of a (lease %v)", time.Since(signalled).Round(time.Millisecond), sig, fleetLeaseTTL)

	var thawed time.Time
	if sig == syscall.SIGSTOP {
		_, mark, err := byInstance(0)
		if err != nil {
			t.Fatal(err)
		}
		thawed = time.Now()
		if err := a.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Thawed, a finds its lease ran out, lets go of its tenants and
		// claims its share again from b.
		fleetUntil(t, "the thawed instance publishes again", func() (bool, error) {
			by, _, err := byInstance(mark)
			return len(by[nameA]) > 0, err
		})
	}
	stopWriting()

	// Every message arrives.
	want := map[string]int{}
	written.Range(func(k, v any) bool {
		want[k.(string)] = v.(int)
		return true
	})
	var res []fleetResult
	fleetUntil(t, "every message arrives", func() (bool, error) {
		res, err = e.results(ctx)
		got := map[string]map[string]bool{}
		for _, r := range res {
			if got[r.Tenant] == nil {
				got[r.Tenant] = map[string]bool{}
			}
			got[r.Tenant][r.UUID] = true
		}
		for id, n := range want {
			if len(got[id]) < n {
				return false, err
			}
		}
		return true, err
	})

	// Each key's first arrivals are in order; a message published again
	// (at least once) is a repeat of one that arrived already. A thawed
	// instance publishes nothing older than what another instance
	// published of the key before: its lease ran out while it was frozen.
	// Short of the call it was in the middle of when frozen, which ends
	// once thawed: a key's first call after the thaw may repeat messages
	// (its Publish may have begun after the thaw, if the freeze came
	// between the start of the call and its Publish).
	inFlight := map[string]int64{} // key → the thawed instance's first call of it
	stale := 0
	first := map[string]bool{}
	last := map[string]int{}              // key → seq of its last first arrival
	others := map[string]map[string]int{} // key → instance → the highest seq it published
	dups := 0
	for _, r := range res {
		if !thawed.IsZero() && r.Started.After(thawed) && r.Instance == nameA {
			if _, ok := inFlight[r.Key]; !ok {
				inFlight[r.Key] = r.Call
			}
			for inst, seq := range others[r.Key] {
				switch {
				case inst == nameA || seq <= r.Seq:
				case r.Call == inFlight[r.Key]:
					stale++
				default:
					t.Errorf("key %s: the thawed instance published seq %d in a call after its first since the thaw, after instance %s had published seq %d",
						r.Key, r.Seq, inst, seq)
				}
			}
		}
		if others[r.Key] == nil {
			others[r.Key] = map[string]int{}
		}
		others[r.Key][r.Instance] = max(others[r.Key][r.Instance], r.Seq)
		if first[r.UUID] {
			dups++
			continue
		}
		first[r.UUID] = true
		if prev, ok := last[r.Key]; ok && r.Seq <= prev {
			t.Fatalf("key %s: seq %d arrived first after seq %d", r.Key, r.Seq, prev)
		}
		last[r.Key] = r.Seq
	}
	t.Logf("%d messages of %d tenants arrived, %d of them more than once", len(first), len(tenants), dups)
	if !thawed.IsZero() {
		t.Logf("%d messages published again after the thaw by calls in flight at the freeze", stale)
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the test ran out of time")
	}
}
