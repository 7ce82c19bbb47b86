package pgfleet

import (
	"slices"
	"testing"

	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestSlotWatchedTables checks the tables a schema tenant rings by: its
// outbox and its scheduled table, qualified by the schema when it has
// one.
func TestSlotWatchedTables(t *testing.T) {
	s, err := NewServer(ServerConfig{DSN: "postgres://app@127.0.0.1/db", Options: postgres.Options{OutboxTable: "events"}})
	if err != nil {
		t.Fatal(err)
	}
	x := &slotStream{s: s, names: map[string][]string{}}
	for schema, want := range map[string][]string{
		"t1":     {`"t1"."events"`, `"t1"."events_scheduled"`},
		"":       {`"events"`, `"events_scheduled"`},
		"bad-id": nil,
	} {
		if got := x.watched(schema); !slices.Equal(got, want) {
			t.Errorf("watched(%q) = %q, want %q", schema, got, want)
		}
	}
}
