package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// deadFlags are the flags of the dead subcommands.
type deadFlags struct {
	common
	filter       ops.Filter
	groupByError bool
	limit        int
	after        int64
	asJSON       bool
	dryRun       bool
	yes          bool
	batch        int
}

// deadAllowed lists the flags each dead subcommand accepts besides the
// common ones.
var deadAllowed = map[string][]string{
	"list":    {"topic", "key", "error", "older-than", "newer-than", "group-by-error", "limit", "after", "json"},
	"show":    {"json"},
	"requeue": {"topic", "key", "error", "older-than", "newer-than", "dry-run", "yes", "batch"},
	"discard": {"topic", "key", "error", "older-than", "newer-than", "dry-run", "yes", "batch"},
}

func deadCmd(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "dead", deadUsage)
	var f deadFlags
	f.register(fs)
	fs.StringVar(&f.filter.Topic, "topic", "", "only dead letters of this exact topic")
	fs.StringVar(&f.filter.Key, "key", "", "only dead letters with this exact ordering key")
	fs.StringVar(&f.filter.ErrorContains, "error", "", "only dead letters whose last error contains this text (case-sensitive)")
	fs.Var(ageFlag{&f.filter.OlderThan}, "older-than", "only dead letters that died longer ago than this (30s, 15m, 36h, 7d)")
	fs.Var(ageFlag{&f.filter.NewerThan}, "newer-than", "only dead letters that died within this long (30s, 15m, 36h, 7d)")
	fs.BoolVar(&f.groupByError, "group-by-error", false, "list: count dead letters per last error instead of listing them")
	fs.IntVar(&f.limit, "limit", ops.DefaultListLimit, "list: at most this many dead letters (or error groups)")
	fs.Int64Var(&f.after, "after", 0, "list: start after this id, to page through many")
	fs.BoolVar(&f.asJSON, "json", false, "list, show: print JSON")
	fs.BoolVar(&f.dryRun, "dry-run", false, "requeue, discard: count what would change, change nothing")
	fs.BoolVar(&f.yes, "yes", false, "requeue, discard: really change the rows a filter selects")
	fs.IntVar(&f.batch, "batch", ops.DefaultBatchSize, "requeue, discard: rows changed per statement")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("dead needs a subcommand: list, show, requeue or discard; run 'millbox help dead'")
	}
	if f.limit < 1 || f.limit > ops.MaxBatchSize || f.batch < 1 || f.batch > ops.MaxBatchSize {
		return usagef("--limit and --batch must be between 1 and %d", ops.MaxBatchSize)
	}
	sub, rest := pos[0], pos[1:]
	allowed, ok := deadAllowed[sub]
	if !ok {
		return usagef("unknown dead subcommand %q: want list, show, requeue or discard", sub)
	}
	var bad []string
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "dsn" || fl.Name == "schema" || fl.Name == "outbox-table" || fl.Name == "inbox-table" || fl.Name == "connect-timeout" {
			return
		}
		for _, a := range allowed {
			if a == fl.Name {
				return
			}
		}
		bad = append(bad, "--"+fl.Name)
	})
	if len(bad) > 0 {
		return usagef("dead %s does not take %s; run 'millbox help dead'", sub, strings.Join(bad, ", "))
	}
	switch sub {
	case "list":
		if len(rest) > 0 {
			return usagef("dead list takes filters, not ids; to see one dead letter use 'millbox dead show ID'")
		}
		return deadList(ctx, e, &f)
	case "show":
		if len(rest) != 1 {
			return usagef("dead show needs one id: millbox dead show 1234")
		}
		id, err := strconv.ParseInt(rest[0], 10, 64)
		if err != nil {
			return usagef("dead show: %q is not an id", rest[0])
		}
		return deadShow(ctx, e, &f, id)
	}
	for _, a := range rest {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return usagef("dead %s: %q is not an id", sub, a)
		}
		f.filter.IDs = append(f.filter.IDs, id)
	}
	return deadChange(ctx, e, &f, sub)
}

func deadList(ctx context.Context, e env, f *deadFlags) error {
	o, closeDB, err := f.openOps(ctx, e)
	if err != nil {
		return err
	}
	defer closeDB()
	if f.groupByError {
		if f.after != 0 {
			return usagef("--after does not apply to --group-by-error")
		}
		groups, err := o.GroupDeadLetters(ctx, f.filter, f.limit)
		if err != nil {
			return err
		}
		if f.asJSON {
			out := []jsonGroup{}
			for _, g := range groups {
				out = append(out, jsonGroup{g.Error, g.Count, g.SampleID, g.FirstDeadAge.Seconds(), g.LastDeadAge.Seconds()})
			}
			return writeJSON(e, out)
		}
		if len(groups) == 0 {
			fmt.Fprintln(e.stdout, "no dead letters match")
			return nil
		}
		w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "COUNT\tSAMPLE ID\tDIED\tERROR")
		for _, g := range groups {
			died := age(g.LastDeadAge) + " ago"
			if g.Count > 1 {
				died = age(g.FirstDeadAge) + " to " + died
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\n", g.Count, g.SampleID, died, oneLine(g.Error, 100))
		}
		w.Flush()
		if len(groups) == f.limit {
			fmt.Fprintf(e.stderr, "showing the %d largest groups; raise --limit for more\n", f.limit)
		}
		return nil
	}
	dls, err := o.ListDeadLetters(ctx, f.filter, f.after, f.limit)
	if err != nil {
		return err
	}
	if f.asJSON {
		out := []jsonDeadLetter{}
		for _, dl := range dls {
			out = append(out, deadLetterJSON(dl))
		}
		return writeJSON(e, out)
	}
	if len(dls) == 0 {
		fmt.Fprintln(e.stdout, "no dead letters match")
		return nil
	}
	now := time.Now()
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tTOPIC\tKEY\tATTEMPTS\tDIED\tERROR")
	for _, dl := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%d\t%s ago\t%s\n", dl.ID, oneLine(dl.Topic, 40), oneLine(dl.Key, 30), dl.Attempts, age(now.Sub(dl.DeadAt)), oneLine(dl.LastError, 80))
	}
	w.Flush()
	if len(dls) == f.limit {
		fmt.Fprintf(e.stderr, "more may follow: add --after %d\n", dls[len(dls)-1].ID)
	}
	return nil
}

func deadShow(ctx context.Context, e env, f *deadFlags, id int64) error {
	o, closeDB, err := f.openOps(ctx, e)
	if err != nil {
		return err
	}
	defer closeDB()
	dl, err := o.ShowDeadLetter(ctx, id)
	if err != nil {
		return err
	}
	if f.asJSON {
		return writeJSON(e, deadLetterJSON(dl))
	}
	now := time.Now()
	w := tabwriter.NewWriter(e.stdout, 0, 4, 1, ' ', 0)
	fmt.Fprintf(w, "Dead letter %d\n", dl.ID)
	fmt.Fprintf(w, "  topic:\t%s\n", dl.Topic)
	fmt.Fprintf(w, "  uuid:\t%s\n", dl.UUID)
	fmt.Fprintf(w, "  key:\t%s\n", dl.Key)
	fmt.Fprintf(w, "  attempts:\t%d\n", dl.Attempts)
	fmt.Fprintf(w, "  created:\t%s (%s ago)\n", dl.CreatedAt.UTC().Format(time.RFC3339), age(now.Sub(dl.CreatedAt)))
	fmt.Fprintf(w, "  died:\t%s (%s ago)\n", dl.DeadAt.UTC().Format(time.RFC3339), age(now.Sub(dl.DeadAt)))
	w.Flush()
	fmt.Fprintf(e.stdout, "  last error:\n%s\n", indent(dl.LastError))
	var meta bytes.Buffer
	if json.Indent(&meta, dl.Metadata, "", "  ") != nil {
		meta.Reset()
		meta.Write(dl.Metadata)
	}
	fmt.Fprintf(e.stdout, "  metadata:\n%s\n", indent(meta.String()))
	if utf8.Valid(dl.Payload) {
		fmt.Fprintf(e.stdout, "  payload (%d bytes):\n%s\n", len(dl.Payload), indent(string(dl.Payload)))
	} else {
		fmt.Fprintf(e.stdout, "  payload (%d bytes, binary):\n%s\n", len(dl.Payload), indent(hex.Dump(dl.Payload)))
	}
	fmt.Fprintf(e.stdout, "\nSend it again with: millbox dead requeue %d\n", dl.ID)
	return nil
}

// deadChange requeues or discards dead letters.
func deadChange(ctx context.Context, e env, f *deadFlags, sub string) error {
	verb, done := "requeue", "requeued"
	if sub == "discard" {
		verb, done = "discard", "discarded"
	}
	o, closeDB, err := f.openOps(ctx, e)
	if err != nil {
		return err
	}
	defer closeDB()
	n, err := o.CountDeadLetters(ctx, f.filter)
	if err != nil {
		return err
	}
	if f.dryRun {
		fmt.Fprintf(e.stdout, "would %s %s (dry run: nothing changed)\n", verb, count(n, "dead letter"))
		return nil
	}
	if n == 0 {
		fmt.Fprintln(e.stdout, "no dead letters match; nothing changed")
		return nil
	}
	// Requeueing the ids one names is undoable (the rows go out again);
	// anything selected by a filter, and every discard, needs --yes.
	if !f.yes && (sub == "discard" || len(f.filter.IDs) == 0) {
		what := "matching the filter"
		if f.filter.IsZero() {
			what = "(every dead letter)"
		}
		return usagef("refusing to %s %s %s without --yes; check them with 'millbox dead list' (or --dry-run) and add --yes to go ahead", verb, count(n, "dead letter"), what)
	}
	opts := ops.ChangeOptions{BatchSize: f.batch}
	if n > int64(f.batch) {
		opts.Progress = func(changed int64) {
			fmt.Fprintf(e.stderr, "%s %d of %d\n", done, changed, n)
		}
	}
	var changed int64
	if sub == "discard" {
		changed, err = o.Discard(ctx, f.filter, opts)
	} else {
		changed, err = o.Requeue(ctx, f.filter, opts)
	}
	if err != nil {
		return fmt.Errorf("%w (%s %s before the error)", err, done, count(changed, "dead letter"))
	}
	fmt.Fprintf(e.stdout, "%s %s\n", done, count(changed, "dead letter"))
	return nil
}

type jsonGroup struct {
	Error               string  `json:"error"`
	Count               int64   `json:"count"`
	SampleID            int64   `json:"sample_id"`
	FirstDeadAgeSeconds float64 `json:"first_dead_age_seconds"`
	LastDeadAgeSeconds  float64 `json:"last_dead_age_seconds"`
}

type jsonDeadLetter struct {
	ID            int64           `json:"id"`
	Topic         string          `json:"topic"`
	UUID          string          `json:"uuid"`
	Key           string          `json:"key"`
	Attempts      int             `json:"attempts"`
	LastError     string          `json:"last_error"`
	CreatedAt     time.Time       `json:"created_at"`
	DeadAt        time.Time       `json:"dead_at"`
	Metadata      json.RawMessage `json:"metadata"`
	Payload       *string         `json:"payload,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
}

// deadLetterJSON renders a dead letter, its payload as text when it is
// UTF-8 and as base64 otherwise.
func deadLetterJSON(dl sqladapters.DeadLetter) jsonDeadLetter {
	j := jsonDeadLetter{
		ID: dl.ID, Topic: dl.Topic, UUID: dl.UUID, Key: dl.Key, Attempts: dl.Attempts, LastError: dl.LastError,
		CreatedAt: dl.CreatedAt.UTC(), DeadAt: dl.DeadAt.UTC(), Metadata: json.RawMessage(dl.Metadata),
	}
	if !json.Valid(dl.Metadata) {
		j.Metadata = json.RawMessage("{}")
	}
	if utf8.Valid(dl.Payload) {
		s := string(dl.Payload)
		j.Payload = &s
	} else {
		j.PayloadBase64 = dl.Payload
	}
	return j
}

// oneLine shortens s to its first line and at most n runes.
func oneLine(s string, n int) string {
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + " …"
	}
	s = strings.ReplaceAll(s, "\t", " ")
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
