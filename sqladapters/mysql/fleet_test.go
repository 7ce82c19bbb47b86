package mysql

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
)

func TestNewFleetDefaults(t *testing.T) {
	f := MustNewFleet(FleetOptions{})
	if o := f.Options(); o.Prefix != DefaultFleetPrefix || o.MigrationLockTimeout != DefaultMigrationLockTimeout || o.SkipLocked {
		t.Fatalf("defaults not applied: %+v", o)
	}
	want := "`millbox_fleet_members` `millbox_fleet_tenants` `millbox_fleet_version` `millbox_fleet_migrations`"
	if got := strings.Join(f.Tables(), " "); got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
	for _, table := range MustNewFleet(FleetOptions{Database: "ops"}).Tables() {
		if !strings.HasPrefix(table, "`ops`.`") {
			t.Fatalf("%s is not qualified", table)
		}
	}
	if pick := MustNewFleet(FleetOptions{SkipLocked: true}).sql.Claim("i", 1).Pick.SQL; !strings.HasSuffix(pick, "FOR UPDATE SKIP LOCKED") {
		t.Fatalf("the pick with SkipLocked: %s", pick)
	}
	if pick := f.sql.Claim("i", 1).Pick.SQL; strings.Contains(pick, "SKIP LOCKED") {
		t.Fatalf("the pick without SkipLocked: %s", pick)
	}
}

func TestNewFleetRejectsBadOptions(t *testing.T) {
	dialecttest.CheckFleetOptions(t, func(o FleetOptions) error { _, err := NewFleet(o); return err }, "mysql.FleetOptions.",
		map[string]FleetOptions{
			"backtick":          {Prefix: "a` (x int); DROP TABLE t; -- "},
			"space":             {Prefix: "my fleet"},
			"dot":               {Prefix: "db.fleet"},
			"too long":          {Prefix: strings.Repeat("p", MaxFleetPrefixLength+1)},
			"bad database":      {Database: "app`; DROP DATABASE x; --"},
			"negative lock":     {MigrationLockTimeout: -time.Second},
			"database too long": {Database: strings.Repeat("d", MaxDatabaseNameLength+1)},
		})
}

func TestFleetNamesAreQuotedEverywhere(t *testing.T) {
	f := MustNewFleet(FleetOptions{Database: "Fl_Db", Prefix: "Fl_Pre"})
	dialecttest.CheckFleetQuoting(t, f.sql, "Fl_Db", '`')
	dialecttest.CheckFleetQuoting(t, f.sql, "Fl_Pre", '`')
}

// TestFleetInsertsFitOnePacket checks that the tenant INSERTs split where
// a statement would pass fleetInsertBytes or the placeholders bound.
func TestFleetInsertsFitOnePacket(t *testing.T) {
	b := MustNewFleet(FleetOptions{}).sql
	var ts []sqladapters.FleetTenant
	for i := range 2500 {
		ts = append(ts, sqladapters.FleetTenant{ID: strconv.Itoa(i), Database: strings.Repeat("d", 1000)})
	}
	qs := b.InsertTenants(ts)
	rows := 0
	for _, q := range qs {
		bytes := 0
		for _, a := range q.Args {
			bytes += 2 * len(a.(string))
		}
		if bytes > fleetInsertBytes || len(q.Args) > 4*fleetIDsPerStatement {
			t.Fatalf("an INSERT of %d arguments, %d bytes", len(q.Args), bytes)
		}
		rows += len(q.Args) / 4
	}
	if rows != len(ts) || len(qs) < 3 {
		t.Fatalf("%d rows in %d statements", rows, len(qs))
	}
}
