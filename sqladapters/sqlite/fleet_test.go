package sqlite

import (
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
)

func TestNewFleetDefaults(t *testing.T) {
	f := MustNewFleet(FleetOptions{})
	if f.Options().Prefix != DefaultFleetPrefix {
		t.Fatalf("defaults not applied: %+v", f.Options())
	}
	want := `"millbox_fleet_members" "millbox_fleet_tenants" "millbox_fleet_version" "millbox_fleet_migrations"`
	if got := strings.Join(f.Tables(), " "); got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
}

func TestNewFleetRejectsBadOptions(t *testing.T) {
	dialecttest.CheckFleetOptions(t, func(o FleetOptions) error { _, err := NewFleet(o); return err }, "sqlite.FleetOptions.",
		map[string]FleetOptions{
			"quote":           {Prefix: `x"; DROP TABLE y; --`},
			"bracket":         {Prefix: "[fleet]"},
			"too long":        {Prefix: strings.Repeat("p", MaxFleetPrefixLength+1)},
			"reserved prefix": {Prefix: "sqlite_fleet"},
			"reserved upper":  {Prefix: "SQLITE_fleet"},
		})
}

func TestFleetNamesAreQuotedEverywhere(t *testing.T) {
	dialecttest.CheckFleetQuoting(t, MustNewFleet(FleetOptions{Prefix: "Fl_Pre"}).sql, "Fl_Pre", '"')
}
