package mysqlfleet_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/forwarder/fleet/mysqlfleet"
	"github.com/millbox/millbox/sqladapters/mysql"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const dsn = "app@tcp(127.0.0.1:3306)/main?parseTime=true"

// TestServerConfigRefusesBadValues checks that each bad field is refused
// with an error that names it.
func TestServerConfigRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		cfg  mysqlfleet.ServerConfig
		want string
	}{
		{mysqlfleet.ServerConfig{}, "DSN is required"},
		{mysqlfleet.ServerConfig{DSN: "app@tcp(127.0.0.1:3306)/main?parseTime=maybe"}, "ServerConfig.DSN"},
		{mysqlfleet.ServerConfig{DSN: dsn, Options: mysql.Options{Database: "app"}}, "Options.Database must be empty"},
		{mysqlfleet.ServerConfig{DSN: dsn, Options: mysql.Options{OutboxTable: "bad-name"}}, "ServerConfig.Options"},
		{mysqlfleet.ServerConfig{DSN: dsn, Doorbell: 5}, "Doorbell DoorbellKind(5)"},
		{mysqlfleet.ServerConfig{DSN: dsn, MinDoorbellInterval: time.Millisecond}, "MinDoorbellInterval"},
		{mysqlfleet.ServerConfig{DSN: dsn, MinDoorbellInterval: 2 * time.Second}, "MaxDoorbellInterval"},
		{mysqlfleet.ServerConfig{DSN: dsn, HotFor: -time.Second}, "HotFor"},
		{mysqlfleet.ServerConfig{DSN: dsn, MaxConns: -1}, "MaxConns"},
	} {
		_, err := mysqlfleet.NewServer(c.cfg)
		if !errors.Is(err, mysqlfleet.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewServer(%+v) = %v, want ErrInvalidConfig naming %q", c.cfg, err, c.want)
		}
	}
}

// TestServerDefaults checks the defaults and the doorbell of each kind.
func TestServerDefaults(t *testing.T) {
	s, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	c := s.Config()
	if c.Doorbell != mysqlfleet.AutoIncrementDoorbell || c.MinDoorbellInterval != mysqlfleet.DefaultMinDoorbellInterval ||
		c.MaxDoorbellInterval != mysqlfleet.DefaultMaxDoorbellInterval || c.HotFor != mysqlfleet.DefaultHotFor ||
		c.MaxConns != mysqlfleet.DefaultMaxConns || s.Doorbell() == nil {
		t.Fatalf("defaults: %+v", c)
	}
	s, err = mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn, Doorbell: mysqlfleet.NoDoorbell})
	if err != nil {
		t.Fatal(err)
	}
	if s.Doorbell() != nil {
		t.Fatal("NoDoorbell gave a doorbell")
	}
}

// TestServerDialect checks that a tenant's dialect qualifies its tables
// with the tenant's database, the DSN's when it names none, and that
// every two tenants share the server's connections.
func TestServerDialect(t *testing.T) {
	s, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn, Options: mysql.Options{OutboxTable: "events"}})
	if err != nil {
		t.Fatal(err)
	}
	for db, want := range map[string]string{"tenant_a": "`tenant_a`.`events`", "": "`main`.`events`"} {
		d, err := s.Dialect(fleet.Tenant{ID: "a", Database: db})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.OutboxTable(); got != want {
			t.Errorf("tenant database %q: outbox %s, want %s", db, got, want)
		}
	}
	if !s.SameDatabase(fleet.Tenant{Database: "a"}, fleet.Tenant{Database: "b"}) {
		t.Error("two databases of one server do not share its connections")
	}
	noDB, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: "app@tcp(127.0.0.1:3306)/"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noDB.Dialect(fleet.Tenant{ID: "x"}); !errors.Is(err, mysqlfleet.ErrInvalidConfig) || !strings.Contains(err.Error(), `tenant "x" names no database`) {
		t.Fatalf("tenant without a database: %v", err)
	}
	if _, err := s.Dialect(fleet.Tenant{ID: "y", Database: "no-db"}); err == nil || !strings.Contains(err.Error(), `tenant "y"`) {
		t.Fatalf("bad database name: %v", err)
	}
}

// TestOpenRefusesBadArguments checks Open's arguments.
func TestOpenRefusesBadArguments(t *testing.T) {
	s, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	if _, err := s.Open(context.Background(), "", nil, time.Second); !errors.Is(err, mysqlfleet.ErrInvalidConfig) {
		t.Errorf("nil dial: %v", err)
	}
	if _, err := s.Open(context.Background(), "", dial, -time.Second); !errors.Is(err, mysqlfleet.ErrInvalidConfig) {
		t.Errorf("negative idle: %v", err)
	}
}
