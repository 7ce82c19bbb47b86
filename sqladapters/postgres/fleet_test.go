package postgres

import (
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
)

func TestNewFleetDefaults(t *testing.T) {
	f := MustNewFleet(FleetOptions{})
	if o := f.Options(); o.Prefix != DefaultFleetPrefix || o.Schema != "" {
		t.Fatalf("defaults not applied: %+v", o)
	}
	want := `"millbox_fleet_members" "millbox_fleet_tenants" "millbox_fleet_version" "millbox_fleet_migrations"`
	if got := strings.Join(f.Tables(), " "); got != want {
		t.Fatalf("tables %s, want %s", got, want)
	}
	for _, table := range MustNewFleet(FleetOptions{Schema: "ops"}).Tables() {
		if !strings.HasPrefix(table, `"ops"."`) {
			t.Fatalf("%s is not qualified", table)
		}
	}
	// Every name derived from the longest prefix fits Postgres' 63 bytes.
	long := strings.Repeat("p", MaxFleetPrefixLength)
	for _, q := range dialecttest.FleetStatements(MustNewFleet(FleetOptions{Prefix: long}).sql) {
		for _, w := range strings.FieldsFunc(q.SQL, func(r rune) bool { return r == '"' || r == ' ' || r == '(' || r == '.' }) {
			if strings.HasPrefix(w, long) && len(w) > 63 {
				t.Fatalf("%s is longer than 63 bytes", w)
			}
		}
	}
}

func TestNewFleetRejectsBadOptions(t *testing.T) {
	dialecttest.CheckFleetOptions(t, func(o FleetOptions) error { _, err := NewFleet(o); return err }, "postgres.FleetOptions.",
		map[string]FleetOptions{
			"quote":           {Prefix: `x"; DROP TABLE y; --`},
			"space":           {Prefix: "my fleet"},
			"dot":             {Prefix: "a.b"},
			"leading digit":   {Prefix: "1fleet"},
			"non-ASCII":       {Prefix: "flëet"},
			"too long":        {Prefix: strings.Repeat("p", MaxFleetPrefixLength+1)},
			"bad schema":      {Schema: `s"; --`},
			"schema dot":      {Schema: "a.b"},
			"schema too long": {Schema: strings.Repeat("s", 64)},
		})
}

func TestFleetNamesAreQuotedEverywhere(t *testing.T) {
	f := MustNewFleet(FleetOptions{Schema: "Fl_Sch", Prefix: "Fl_Pre"})
	dialecttest.CheckFleetQuoting(t, f.sql, "Fl_Sch", '"')
	dialecttest.CheckFleetQuoting(t, f.sql, "Fl_Pre", '"')
}
