package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/millbox/millbox/sqladapters/ops"
)

func statusCmd(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "status", statusUsage)
	var c common
	c.register(fs)
	var fl fleetFlags
	fl.register(fs)
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("status takes no arguments, got %q", pos[0])
	}
	if err := fl.check(&c); err != nil {
		return err
	}
	if fl.on {
		return statusFleet(ctx, e, &c, &fl, *asJSON)
	}
	s, err := c.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	st, err := s.o.Status(ctx)
	if err != nil {
		return s.explain(ctx, err)
	}
	if *asJSON {
		return writeJSON(e, statusJSON(s.o, st))
	}
	printStatus(ctx, e, s, st)
	return nil
}

// jsonStatus is the --json form of ops.Status.
type jsonStatus struct {
	Database                string          `json:"database"`
	OutboxTable             string          `json:"outbox_table"`
	InboxTable              string          `json:"inbox_table"`
	Pending                 int64           `json:"pending"`
	Retrying                int64           `json:"retrying"`
	OldestPendingAgeSeconds float64         `json:"oldest_pending_age_seconds"`
	Scheduled               int64           `json:"scheduled"`
	NextDue                 *time.Time      `json:"next_due,omitempty"`
	DeadLetters             int64           `json:"dead_letters"`
	HeldKeys                int64           `json:"held_keys"`
	ForwardedKept           int64           `json:"forwarded_kept"`
	InboxRecords            int64           `json:"inbox_records"`
	OldestInboxAgeSeconds   float64         `json:"oldest_inbox_age_seconds"`
	Topics                  []jsonTopic     `json:"topics"`
	Consumers               []jsonConsumer  `json:"consumers"`
	Partitions              []jsonPartition `json:"partitions"`
	Owners                  []jsonOwner     `json:"owners"`
}

type jsonTopic struct {
	Topic                   string     `json:"topic"`
	Pending                 int64      `json:"pending"`
	Retrying                int64      `json:"retrying"`
	OldestPendingAgeSeconds float64    `json:"oldest_pending_age_seconds"`
	Scheduled               int64      `json:"scheduled"`
	NextDue                 *time.Time `json:"next_due,omitempty"`
	DeadLetters             int64      `json:"dead_letters"`
	ForwardedKept           int64      `json:"forwarded_kept"`
}

type jsonConsumer struct {
	Consumer         string  `json:"consumer"`
	Records          int64   `json:"records"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
}

type jsonPartition struct {
	Partition        int     `json:"partition"`
	Owner            string  `json:"owner"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
}

type jsonOwner struct {
	Instance   string `json:"instance"`
	Partitions []int  `json:"partitions"`
}

func statusJSON(o *ops.Ops, st ops.Status) jsonStatus {
	d := o.Dialect()
	j := jsonStatus{
		Database:                d.Name(),
		OutboxTable:             unquote(d.OutboxTable()),
		InboxTable:              unquote(d.InboxTable()),
		Pending:                 st.Pending,
		Retrying:                st.Retrying,
		OldestPendingAgeSeconds: st.OldestPendingAge.Seconds(),
		Scheduled:               st.Scheduled,
		NextDue:                 timeOrNil(st.NextDue),
		DeadLetters:             st.Dead,
		HeldKeys:                st.HeldKeys,
		ForwardedKept:           st.ForwardedKept,
		InboxRecords:            st.InboxRecords,
		OldestInboxAgeSeconds:   st.OldestInboxAge.Seconds(),
		Topics:                  []jsonTopic{},
		Consumers:               []jsonConsumer{},
		Partitions:              []jsonPartition{},
		Owners:                  []jsonOwner{},
	}
	for _, t := range st.Topics {
		j.Topics = append(j.Topics, jsonTopic{t.Topic, t.Pending, t.Retrying, t.OldestPendingAge.Seconds(), t.Scheduled, timeOrNil(t.NextDue), t.Dead, t.ForwardedKept})
	}
	for _, c := range st.Consumers {
		j.Consumers = append(j.Consumers, jsonConsumer{c.Consumer, c.Records, c.OldestAge.Seconds()})
	}
	for _, p := range st.Partitions {
		j.Partitions = append(j.Partitions, jsonPartition{p.Partition, p.Owner, p.ExpiresIn.Seconds()})
	}
	for _, w := range st.Owners {
		j.Owners = append(j.Owners, jsonOwner{w.Instance, w.Partitions})
	}
	return j
}

// timeOrNil is t, nil for the zero time.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func writeJSON(e env, v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// age renders an age, "-" for none.
func age(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return formatAge(d)
}

func printStatus(ctx context.Context, e env, s *session, st ops.Status) {
	d := s.d
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Outbox %s in %s\n", tableName(d.OutboxTable()), s.schema(ctx))
	fmt.Fprintln(w, "TOPIC\tPENDING\tRETRYING\tOLDEST PENDING\tSCHEDULED\tDEAD\tFORWARDED KEPT")
	for _, t := range st.Topics {
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t%d\t%d\n", oneLine(t.Topic, 60), t.Pending, t.Retrying, age(t.OldestPendingAge), t.Scheduled, t.Dead, t.ForwardedKept)
	}
	fmt.Fprintf(w, "(all)\t%d\t%d\t%s\t%d\t%d\t%d\n", st.Pending, st.Retrying, age(st.OldestPendingAge), st.Scheduled, st.Dead, st.ForwardedKept)
	w.Flush()
	if !st.NextDue.IsZero() {
		fmt.Fprintf(e.stdout, "Next scheduled message due %s\n", st.NextDue.UTC().Format(time.RFC3339))
	}

	fmt.Fprintf(e.stdout, "\nInbox %s: %s", tableName(d.InboxTable()), count(st.InboxRecords, "record"))
	if st.InboxRecords > 0 {
		fmt.Fprintf(e.stdout, ", oldest %s", age(st.OldestInboxAge))
	}
	fmt.Fprintln(e.stdout)
	if len(st.Consumers) > 0 {
		fmt.Fprintln(w, "CONSUMER\tRECORDS\tOLDEST")
		for _, c := range st.Consumers {
			fmt.Fprintf(w, "%s\t%d\t%s\n", oneLine(c.Consumer, 60), c.Records, age(c.OldestAge))
		}
		w.Flush()
	}

	free := 0
	for _, p := range st.Partitions {
		if p.Owner == "" {
			free++
		}
	}
	fmt.Fprintf(e.stdout, "\nPartitions: %d, held by %s, %d free\n", len(st.Partitions), count(int64(len(st.Owners)), "instance"), free)
	if len(st.Owners) > 0 {
		fmt.Fprintln(w, "INSTANCE\tPARTITIONS")
		for _, ow := range st.Owners {
			fmt.Fprintf(w, "%s\t%s\n", oneLine(ow.Instance, 60), ranges(ow.Partitions))
		}
		w.Flush()
	}
	if st.Dead > 0 {
		fmt.Fprintf(e.stdout, "\n%s: see them with: %s\n", count(st.Dead, "dead letter"), s.hint("dead list --group-by-error"))
	}
	if st.HeldKeys > 0 {
		fmt.Fprintf(e.stdout, "%s held by dead letters: see them with: %s\n", count(st.HeldKeys, "key"), s.hint("dead held"))
	}
}

// ranges renders sorted numbers as "0-3,7,9-10".
func ranges(v []int) string {
	var parts []string
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(v[i]))
		} else {
			parts = append(parts, strconv.Itoa(v[i])+"-"+strconv.Itoa(v[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// unquote removes the identifier quotes of a dialect's table name, for
// display: the names are plain identifiers.
func unquote(name string) string {
	return strings.NewReplacer(`"`, "", "`", "").Replace(name)
}

// tableName is a dialect's table name without its quotes and schema, for
// messages that name the schema apart.
func tableName(quoted string) string {
	name := unquote(quoted)
	return name[strings.LastIndexByte(name, '.')+1:]
}
