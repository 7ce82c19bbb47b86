package pgfleet_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/pgfleet"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const dsn = "postgres://app@127.0.0.1:5432/main"

// TestServerConfigRefusesBadValues checks that each bad field is refused
// with an error that names it.
func TestServerConfigRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		cfg  pgfleet.ServerConfig
		want string
	}{
		{pgfleet.ServerConfig{}, "DSN is required"},
		{pgfleet.ServerConfig{DSN: "postgres://x:notaport/db"}, "ServerConfig.DSN"},
		{pgfleet.ServerConfig{DSN: dsn, Options: postgres.Options{Schema: "app"}}, "Options.Schema must be empty"},
		{pgfleet.ServerConfig{DSN: dsn, Options: postgres.Options{OutboxTable: "bad-name"}}, "ServerConfig.Options"},
		{pgfleet.ServerConfig{DSN: dsn, Doorbell: 7}, "Doorbell DoorbellKind(7)"},
		{pgfleet.ServerConfig{DSN: dsn, DoorbellInterval: time.Millisecond}, "DoorbellInterval"},
		{pgfleet.ServerConfig{DSN: dsn, MaxConns: -1}, "MaxConns"},
		{pgfleet.ServerConfig{DSN: dsn, HealthCheckPeriod: -time.Second}, "HealthCheckPeriod"},
		{pgfleet.ServerConfig{DSN: dsn, ApplicationName: strings.Repeat("a", 55)}, "ApplicationName"},
		{pgfleet.ServerConfig{DSN: dsn, ApplicationName: "fleet\n"}, "printable ASCII"},
	} {
		_, err := pgfleet.NewServer(c.cfg)
		if !errors.Is(err, pgfleet.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewServer(%+v) = %v, want ErrInvalidConfig naming %q", c.cfg, err, c.want)
		}
	}
}

// TestServerDefaults checks the defaults and which doorbell each kind
// gives.
func TestServerDefaults(t *testing.T) {
	s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	if c.Doorbell != pgfleet.StatDoorbell || c.DoorbellInterval != pgfleet.DefaultDoorbellInterval ||
		c.MaxConns != pgfleet.DefaultDatabaseMaxConns || c.ApplicationName != pgfleet.DefaultApplicationName {
		t.Fatalf("defaults: %+v", c)
	}
	// A handle that the schemas of a database share gets more than one
	// connection; with Notify, a database's handle one for its listener.
	for _, tc := range []struct {
		cfg  pgfleet.ServerConfig
		want int32
	}{
		{pgfleet.ServerConfig{DSN: dsn, Doorbell: pgfleet.SlotDoorbell}, pgfleet.DefaultMaxConns},
		{pgfleet.ServerConfig{DSN: dsn, Doorbell: pgfleet.NoDoorbell}, pgfleet.DefaultMaxConns},
		{pgfleet.ServerConfig{DSN: dsn, Options: postgres.Options{Notify: true}}, pgfleet.DefaultDatabaseMaxConns + 1},
		{pgfleet.ServerConfig{DSN: dsn, MaxConns: 3}, 3},
	} {
		s, err := pgfleet.NewServer(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Config().MaxConns; got != tc.want {
			t.Errorf("MaxConns of %+v = %d, want %d", tc.cfg, got, tc.want)
		}
	}
	for kind, want := range map[pgfleet.DoorbellKind]bool{pgfleet.StatDoorbell: true, pgfleet.SlotDoorbell: true, pgfleet.NoDoorbell: false} {
		s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dsn, Doorbell: kind})
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Doorbell() != nil; got != want {
			t.Errorf("%v: doorbell present %v, want %v", kind, got, want)
		}
	}
}

// TestServerDialectAndDatabases checks that a tenant's dialect is the
// configured one in the tenant's schema, and that tenants share a
// database when their databases agree, "" being the DSN's.
func TestServerDialectAndDatabases(t *testing.T) {
	s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dsn, Options: postgres.Options{OutboxTable: "events"}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Dialect(fleet.Tenant{ID: "a", Schema: "tenant_a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.OutboxTable(); got != `"tenant_a"."events"` {
		t.Fatalf("outbox table %s", got)
	}
	if _, err := s.Dialect(fleet.Tenant{ID: "b", Schema: "no-schema"}); !errors.Is(err, sqladapters.ErrInvalidName) || !strings.Contains(err.Error(), `tenant "b"`) {
		t.Fatalf("bad schema: %v", err)
	}
	for _, c := range []struct {
		a, b string
		same bool
	}{{"", "", true}, {"", "main", true}, {"t1", "t1", true}, {"t1", "t2", false}, {"", "t1", false}} {
		if got := s.SameDatabase(fleet.Tenant{Database: c.a}, fleet.Tenant{Database: c.b}); got != c.same {
			t.Errorf("SameDatabase(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// TestOpenRefusesBadArguments checks Open's arguments.
func TestOpenRefusesBadArguments(t *testing.T) {
	s, err := pgfleet.NewServer(pgfleet.ServerConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	if _, err := s.Open(context.Background(), "", nil, time.Second); !errors.Is(err, pgfleet.ErrInvalidConfig) {
		t.Errorf("nil dial: %v", err)
	}
	if _, err := s.Open(context.Background(), "", dial, 0); !errors.Is(err, pgfleet.ErrInvalidConfig) {
		t.Errorf("zero idle: %v", err)
	}
}
