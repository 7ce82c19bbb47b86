package postgres

import (
	"testing"
	"time"
)

func TestPartitionRanges(t *testing.T) {
	at := time.Date(2026, 11, 25, 19, 30, 0, 0, time.UTC) // a Wednesday
	for _, c := range []struct {
		interval time.Duration
		start    time.Time
	}{
		{time.Hour, time.Date(2026, 11, 25, 19, 0, 0, 0, time.UTC)},
		{6 * time.Hour, time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)},
		{24 * time.Hour, time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)},
		{7 * 24 * time.Hour, time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)}, // Monday
	} {
		o := PartitionOptions{Interval: c.interval}
		if got := o.rangeStart(at); !got.Equal(c.start) {
			t.Errorf("interval %v: range starts %v, want %v", c.interval, got, c.start)
		}
		if got := o.rangeStart(at.In(time.FixedZone("x", -7*3600))); !got.Equal(c.start) {
			t.Errorf("interval %v: the time zone of now moved the range to %v", c.interval, got)
		}
	}
	// Before the origin too.
	o := PartitionOptions{Interval: 24 * time.Hour}
	if got, want := o.rangeStart(time.Date(1999, 12, 31, 5, 0, 0, 0, time.UTC)), time.Date(1999, 12, 31, 0, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Errorf("before the origin: %v, want %v", got, want)
	}
	d := MustNew(Options{OutboxTable: "events", Partitioned: &PartitionOptions{}})
	if got := d.sql.partitionName(time.Date(2026, 11, 25, 0, 0, 0, 0, time.FixedZone("x", 3600))); got != "events_p20261124_2300" {
		t.Errorf("partition name %q", got)
	}
	if got := pgTimestamp(time.Date(2026, 11, 25, 1, 0, 0, 0, time.FixedZone("x", 3600))); got != "'2026-11-25 00:00:00+00'" {
		t.Errorf("bound literal %s", got)
	}
}
