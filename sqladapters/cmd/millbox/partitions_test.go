package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestPartitions(t *testing.T) {
	t.Parallel()
	in := postgresInstallation(t)
	schema := in.flags[1]
	d := postgres.MustNew(postgres.Options{Schema: schema, Partitioned: &postgres.PartitionOptions{}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sqladapters.Migrate(ctx, in.db, d); err != nil {
		t.Fatal(err)
	}
	base := []string{"--dsn", in.dsn, "--schema", schema}

	var parts []jsonOutboxPartition
	runJSON(t, &parts, append([]string{"partitions", "list"}, base...)...)
	if len(parts) != 5 || !parts[0].Default || parts[1].From == nil {
		t.Fatalf("listed %+v; want the default partition, the current one and 3 ahead", parts)
	}
	if r := mustRun(t, append([]string{"partitions", "list"}, base...)...); !strings.Contains(r.stdout, "(default)") {
		t.Fatalf("list: %s", r)
	}
	if r := mustRun(t, append([]string{"partitions", "maintain"}, base...)...); !strings.Contains(r.stdout, "up to date") {
		t.Fatalf("maintain right after migrating: %s", r)
	}
	var rep jsonMaintenance
	runJSON(t, &rep, append([]string{"partitions", "maintain", "--ahead", "5"}, base...)...)
	if len(rep.Created) != 2 || rep.Busy {
		t.Fatalf("maintain --ahead 5 after 3: %+v", rep)
	}

	for _, args := range [][]string{
		{"partitions"},
		{"partitions", "drop"},
		{"partitions", "maintain", "--interval", "90m"},
	} {
		if r := runCmd(t, append(args, base...)...); r.code != exitUsage || r.stderr == "" {
			t.Fatalf("%v: want exit 2 with a message, got %s", args, r)
		}
	}
	if r := runCmd(t, "partitions", "list", "--dsn", "sqlite://x.db"); r.code != exitUsage || !strings.Contains(r.stderr, "PostgreSQL only") {
		t.Fatalf("partitions on SQLite: %s", r)
	}
	// A plain outbox has no partitions.
	plain := postgresInstallation(t)
	mustRun(t, append([]string{"migrate", "up", "--dsn", plain.dsn}, plain.flags...)...)
	if r := runCmd(t, append([]string{"partitions", "list", "--dsn", plain.dsn}, plain.flags...)...); r.code != exitError || !strings.Contains(r.stderr, "not partitioned") {
		t.Fatalf("list on a plain outbox: %s", r)
	}
	if r := mustRun(t, "help", "partitions"); !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "-retain") {
		t.Fatalf("help partitions: %s", r)
	}
}
