package postgres_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestPartitionOptionsDefaults(t *testing.T) {
	d := postgres.MustNew(postgres.Options{Partitioned: &postgres.PartitionOptions{}})
	p := d.Options().Partitioned
	want := postgres.PartitionOptions{
		Interval: postgres.DefaultPartitionInterval, Ahead: postgres.DefaultPartitionsAhead,
		Retain: postgres.DefaultPartitionRetain, MaintainEvery: time.Hour,
		LockTimeout: postgres.DefaultPartitionLockTimeout,
	}
	if *p != want {
		t.Fatalf("defaults %+v, want %+v", *p, want)
	}
	if d.MaintainEvery() != time.Hour {
		t.Fatalf("MaintainEvery %v", d.MaintainEvery())
	}
	// Weekly partitions are kept a week at least.
	w := postgres.MustNew(postgres.Options{Partitioned: &postgres.PartitionOptions{Interval: 14 * 24 * time.Hour}})
	if r := w.Options().Partitioned.Retain; r != 14*24*time.Hour {
		t.Fatalf("Retain of 14-day partitions defaults to %v", r)
	}
	off := postgres.MustNew(postgres.Options{Partitioned: &postgres.PartitionOptions{MaintainEvery: -1}})
	if off.MaintainEvery() != 0 {
		t.Fatalf("MaintainEvery turned off reports %v", off.MaintainEvery())
	}
	if plain := postgres.MustNew(postgres.Options{}); plain.MaintainEvery() != 0 {
		t.Fatalf("plain layout reports MaintainEvery %v", plain.MaintainEvery())
	}
	var _ sqladapters.Maintainer = d
}

func TestPartitionOptionsRejected(t *testing.T) {
	for _, c := range []struct {
		o     postgres.PartitionOptions
		field string
	}{
		{postgres.PartitionOptions{Interval: 90 * time.Minute}, "Interval"},
		{postgres.PartitionOptions{Interval: time.Minute}, "Interval"},
		{postgres.PartitionOptions{Interval: -time.Hour}, "Interval"},
		{postgres.PartitionOptions{Ahead: -1}, "Ahead"},
		{postgres.PartitionOptions{Retain: time.Hour}, "Retain"},
		{postgres.PartitionOptions{LockTimeout: -time.Second}, "LockTimeout"},
		{postgres.PartitionOptions{Interval: time.Hour, Ahead: 1, MaintainEvery: time.Hour}, "MaintainEvery"},
		{postgres.PartitionOptions{Interval: time.Hour, Retain: 365 * 24 * time.Hour}, "Retain"},
	} {
		_, err := postgres.New(postgres.Options{Partitioned: &c.o})
		if !errors.Is(err, sqladapters.ErrInvalidConfig) || !strings.Contains(err.Error(), "PartitionOptions."+c.field) {
			t.Errorf("%+v: want ErrInvalidConfig naming %s, got %v", c.o, c.field, err)
		}
	}
}

func TestPartitionedMigrations(t *testing.T) {
	plain := postgres.MustNew(postgres.Options{Schema: "app"})
	d := postgres.MustNew(postgres.Options{Schema: "app", Partitioned: &postgres.PartitionOptions{}})
	pm, dm := plain.Migrations(), d.Migrations()
	if len(pm) != len(dm) {
		t.Fatalf("%d versions in the partitioned layout, %d in the plain one", len(dm), len(pm))
	}
	for i := range pm {
		if pm[i].Version != dm[i].Version || pm[i].Name != dm[i].Name {
			t.Fatalf("version %d differs: %+v vs %+v", i, pm[i], dm[i])
		}
		// Version 5 creates the kept rows' table, partitioned like the
		// outbox in the partitioned layout; every other later version is
		// shared.
		if i > 0 && pm[i].Version != 5 && strings.Join(pm[i].Statements, ";") != strings.Join(dm[i].Statements, ";") {
			t.Fatalf("version %d must be shared by both layouts", pm[i].Version)
		}
	}
	script := sqladapters.MigrationSQL(d)
	for _, want := range []string{
		`PARTITION BY RANGE (created_at)`, `PRIMARY KEY (id, created_at)`,
		`"app"."millbox_outbox_default" PARTITION OF "app"."millbox_outbox" DEFAULT`,
		`CREATE TABLE IF NOT EXISTS "app"."millbox_outbox_leases"`, `"app"."millbox_inbox"`,
		`"app"."millbox_outbox_kept_default" PARTITION OF "app"."millbox_outbox_kept" DEFAULT`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("partitioned migrations lack %q:\n%s", want, script)
		}
	}
	if strings.Contains(sqladapters.MigrationSQL(plain), "PARTITION") {
		t.Error("plain layout migrations mention partitions")
	}
}
