package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/millbox/millbox/sqladapters/postgres"
)

const partitionsUsage = `Usage:
  millbox partitions list     [--json] [flags]
  millbox partitions maintain [--interval D] [--ahead N] [--retain D] [--lock-timeout D] [--json] [flags]

PostgreSQL only, for an outbox created with the time-partitioned layout
(postgres.Options.Partitioned): one partition per interval of creation time, and a
default partition for rows whose time has none. The table of forwarded rows kept for
audit is partitioned alike, and each range's two partitions come and go together.

'list' shows each partition with its range, its estimated rows and kept rows, the size
of both, and its pending rows.

'maintain' creates the partition of the current interval and the --ahead following
ones, and drops the partitions whose range ended more than --retain ago, with their
kept rows, unless they hold pending rows (it lists those; they go at a later run once
forwarded). Forwarders do this on their own every
PartitionOptions.MaintainEvery; run it here when that is turned off, from cron for
instance. It is idempotent and safe next to running forwarders: when another process
is maintaining, it says so and changes nothing. Times are the database's.

The layout flags must match the postgres.PartitionOptions your application gives the
dialect; zero or absent means the same default:
  --interval      PartitionOptions.Interval     (default 24h; whole hours)
  --ahead         PartitionOptions.Ahead        (default 3)
  --retain        PartitionOptions.Retain       (default 7d)
  --lock-timeout  PartitionOptions.LockTimeout  (default 2s)

Examples:
  millbox partitions list --schema messaging
  millbox partitions maintain --schema messaging
  millbox partitions maintain --interval 1h --ahead 6 --retain 2d --json
`

func partitionsCmd(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "partitions", partitionsUsage)
	var c common
	c.register(fs)
	var po postgres.PartitionOptions
	fs.Var(ageFlag{&po.Interval}, "interval", "range of one partition, whole hours (PartitionOptions.Interval; default 24h)")
	fs.IntVar(&po.Ahead, "ahead", 0, "partitions kept created after the current one (PartitionOptions.Ahead; default 3)")
	fs.Var(ageFlag{&po.Retain}, "retain", "drop partitions whose range ended longer ago (PartitionOptions.Retain; default 7d)")
	fs.Var(ageFlag{&po.LockTimeout}, "lock-timeout", "longest wait for a table lock per step (PartitionOptions.LockTimeout; default 2s)")
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || (pos[0] != "list" && pos[0] != "maintain") {
		return usagef("partitions needs one subcommand, list or maintain; run 'millbox help partitions'")
	}
	t, _, err := c.target(e)
	if err != nil {
		return err
	}
	if t.kind != "postgres" {
		return usagef("partitions apply to PostgreSQL only; this --dsn is %s", t.kind)
	}
	d, err := postgres.New(postgres.Options{
		Schema: c.tables.schema, OutboxTable: c.tables.outbox, InboxTable: c.tables.inbox,
		Partitioned: &po,
	})
	if err != nil {
		return usageError{err.Error()}
	}
	cn, err := c.open(ctx, t, false)
	if err != nil {
		return err
	}
	defer cn.close()
	if pos[0] == "list" {
		parts, err := postgres.ListPartitions(ctx, cn.db, d)
		if err != nil {
			return err
		}
		return printPartitions(e, parts, *asJSON)
	}
	rows, err := cn.db.Query(ctx, `SELECT now()`)
	if err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	var now time.Time
	for rows.Next() {
		err = rows.Scan(&now)
	}
	rows.Close()
	if err != nil {
		return fmt.Errorf("read the database clock: %w", err)
	}
	rep, err := postgres.MaintainPartitions(ctx, cn.db, d, now)
	if perr := printMaintenance(e, rep, *asJSON); perr != nil && err == nil {
		err = perr
	}
	return err
}

// jsonOutboxPartition is the --json form of postgres.PartitionInfo.
type jsonOutboxPartition struct {
	Name          string     `json:"name"`
	Default       bool       `json:"default,omitempty"`
	From          *time.Time `json:"from,omitempty"`
	To            *time.Time `json:"to,omitempty"`
	EstimatedRows int64      `json:"estimated_rows"`
	KeptRows      int64      `json:"kept_estimated_rows"`
	Bytes         int64      `json:"bytes"`
	Pending       int64      `json:"pending"`
}

func partitionJSON(p postgres.Partition) jsonOutboxPartition {
	j := jsonOutboxPartition{Name: p.Name, Default: p.Default}
	if !p.From.IsZero() {
		j.From, j.To = &p.From, &p.To
	}
	return j
}

func printPartitions(e env, parts []postgres.PartitionInfo, asJSON bool) error {
	if asJSON {
		out := make([]jsonOutboxPartition, 0, len(parts))
		for _, p := range parts {
			j := partitionJSON(p.Partition)
			j.EstimatedRows, j.KeptRows, j.Bytes, j.Pending = p.EstimatedRows, p.KeptEstimatedRows, p.Bytes, p.Pending
			out = append(out, j)
		}
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tFROM (UTC)\tTO (UTC)\tROWS (EST.)\tKEPT (EST.)\tSIZE\tPENDING")
	estimate := func(n int64) string {
		if n < 0 {
			return "?"
		}
		return fmt.Sprint(n)
	}
	for _, p := range parts {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\n", p.Name, bound(p.Partition, p.From), bound(p.Partition, p.To),
			estimate(p.EstimatedRows), estimate(p.KeptEstimatedRows), bytesText(p.Bytes), p.Pending)
	}
	return w.Flush()
}

func bound(p postgres.Partition, t time.Time) string {
	switch {
	case p.Default:
		return "(default)"
	case t.IsZero():
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04")
}

func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// jsonMaintenance is the --json form of postgres.MaintenanceReport.
type jsonMaintenance struct {
	Busy    bool                  `json:"busy"`
	Created []jsonOutboxPartition `json:"created"`
	Dropped []jsonOutboxPartition `json:"dropped"`
	Kept    []jsonOutboxPartition `json:"kept"`
	Blocked []jsonOutboxPartition `json:"blocked"`
}

func printMaintenance(e env, rep postgres.MaintenanceReport, asJSON bool) error {
	if asJSON {
		j := jsonMaintenance{Busy: rep.Busy, Created: []jsonOutboxPartition{}, Dropped: []jsonOutboxPartition{},
			Kept: []jsonOutboxPartition{}, Blocked: []jsonOutboxPartition{}}
		for _, p := range rep.Created {
			j.Created = append(j.Created, partitionJSON(p))
		}
		for _, p := range rep.Dropped {
			j.Dropped = append(j.Dropped, partitionJSON(p))
		}
		for _, k := range rep.Kept {
			pj := partitionJSON(k.Partition)
			pj.Pending = k.Pending
			j.Kept = append(j.Kept, pj)
		}
		for _, p := range rep.Blocked {
			j.Blocked = append(j.Blocked, partitionJSON(p))
		}
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(j)
	}
	if rep.Busy {
		fmt.Fprintln(e.stdout, "another process is maintaining the partitions; nothing done")
		return nil
	}
	span := func(p postgres.Partition) string {
		return fmt.Sprintf("%s [%s, %s)", p.Name, bound(p, p.From), bound(p, p.To))
	}
	for _, p := range rep.Created {
		fmt.Fprintln(e.stdout, "created", span(p))
	}
	for _, p := range rep.Dropped {
		fmt.Fprintln(e.stdout, "dropped", span(p))
	}
	for _, k := range rep.Kept {
		fmt.Fprintf(e.stdout, "kept    %s: past retention but holds %s\n", span(k.Partition), count(k.Pending, "pending row"))
	}
	for _, p := range rep.Blocked {
		fmt.Fprintf(e.stdout, "blocked %s: the default partition holds rows of this range; they are forwarded from there\n", span(p))
	}
	if len(rep.Created)+len(rep.Dropped)+len(rep.Kept)+len(rep.Blocked) == 0 {
		fmt.Fprintln(e.stdout, "partitions are up to date")
	}
	return nil
}
