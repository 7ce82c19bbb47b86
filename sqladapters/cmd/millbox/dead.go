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
	"requeue": {"topic", "key", "error", "older-than", "newer-than", "all", "dry-run", "yes", "batch"},
	"discard": {"topic", "key", "error", "older-than", "newer-than", "all", "dry-run", "yes", "batch"},
	"held":    {"limit", "json"},
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
	fs.BoolVar(&f.filter.All, "all", false, "requeue, discard: every dead letter (instead of ids or filters)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "requeue, discard: count what would change, change nothing")
	fs.BoolVar(&f.yes, "yes", false, "requeue, discard: really change the rows a filter selects")
	fs.IntVar(&f.batch, "batch", ops.DefaultBatchSize, "requeue, discard: rows changed per statement")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usagef("dead needs a subcommand: list, show, held, requeue or discard; run 'millbox help dead'")
	}
	if f.limit < 1 || f.limit > ops.MaxBatchSize || f.batch < 1 || f.batch > ops.MaxBatchSize {
		return usagef("--limit and --batch must be between 1 and %d", ops.MaxBatchSize)
	}
	sub, rest := pos[0], pos[1:]
	allowed, ok := deadAllowed[sub]
	if !ok {
		return usagef("unknown dead subcommand %q: want list, show, held, requeue or discard", sub)
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
	case "held":
		if len(rest) > 0 {
			return usagef("dead held takes no arguments, got %q", rest[0])
		}
		return deadHeld(ctx, e, &f)
	}
	for _, a := range rest {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return usagef("dead %s: %q is not an id", sub, a)
		}
		f.filter.IDs = append(f.filter.IDs, id)
	}
	// A change of every dead letter is said with --all, never left to an
	// empty filter: a script whose variable came out empty changes nothing.
	switch {
	case f.filter.All && !f.filter.IsZero():
		return usagef("dead %s: --all means every dead letter; give it without ids and filters, or leave it out", sub)
	case !f.filter.All && f.filter.IsZero():
		return usagef("dead %s needs ids, a filter, or --all for every dead letter; run 'millbox help dead'", sub)
	}
	return deadChange(ctx, e, &f, sub)
}

func deadList(ctx context.Context, e env, f *deadFlags) error {
	if f.groupByError && f.after != 0 {
		return usagef("--after does not apply to --group-by-error")
	}
	s, err := f.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	if f.groupByError {
		groups, err := s.o.GroupDeadLetters(ctx, f.filter, f.limit)
		if err != nil {
			return s.explain(ctx, err)
		}
		if f.asJSON {
			out := []jsonGroup{}
			for _, g := range groups {
				out = append(out, jsonGroup{g.Fingerprint.String(), g.Error, g.Count, g.SampleID, g.FirstDeadAge.Seconds(), g.LastDeadAge.Seconds()})
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
			text := oneLine(g.Error, 100)
			if g.Fingerprint.IsZero() {
				text = "(errors recorded without a fingerprint, such as " + oneLine(g.Error, 60) + ")"
			}
			fmt.Fprintf(w, "%d\t%d\t%s\t%s\n", g.Count, g.SampleID, died, text)
		}
		w.Flush()
		if len(groups) == f.limit {
			fmt.Fprintf(e.stderr, "showing the %d largest groups; raise --limit for more\n", f.limit)
		}
		return nil
	}
	q := ops.ListQuery{Filter: f.filter, AfterID: f.after, Limit: f.limit, Payloads: f.asJSON}
	if !f.asJSON {
		q.ErrorChars = 200 // the table shows 80
	}
	dls, err := s.o.ListDeadLetters(ctx, q)
	if err != nil {
		return s.explain(ctx, err)
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

// jsonHeldKey is the --json form of a key held by a dead letter.
type jsonHeldKey struct {
	Key          string `json:"key"`
	DeadLetterID int64  `json:"dead_letter_id"`
	Held         int64  `json:"held"`
}

// deadHeld lists the keys held by dead letters and the messages waiting
// behind each.
func deadHeld(ctx context.Context, e env, f *deadFlags) error {
	s, err := f.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	keys, err := s.o.HeldKeys(ctx, f.limit)
	if err != nil {
		return s.explain(ctx, err)
	}
	if f.asJSON {
		out := []jsonHeldKey{}
		for _, k := range keys {
			out = append(out, jsonHeldKey{k.Key, k.DeadLetterID, k.Held})
		}
		return writeJSON(e, out)
	}
	if len(keys) == 0 {
		fmt.Fprintln(e.stdout, "no keys are held by dead letters")
		return nil
	}
	w := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tDEAD LETTER\tHELD")
	for _, k := range keys {
		fmt.Fprintf(w, "%s\t%d\t%d\n", oneLine(k.Key, 60), k.DeadLetterID, k.Held)
	}
	w.Flush()
	if len(keys) == f.limit {
		fmt.Fprintf(e.stderr, "showing the first %d held keys; raise --limit for more\n", f.limit)
	}
	fmt.Fprintf(e.stdout, "\nSend a dead letter and then its key's held messages with: %s\nLet them go on without it with: %s\n",
		f.hint(fmt.Sprint("dead requeue ", keys[0].DeadLetterID)), f.hint(fmt.Sprint("dead discard ", keys[0].DeadLetterID, " --yes")))
	return nil
}

func deadShow(ctx context.Context, e env, f *deadFlags, id int64) error {
	s, err := f.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	dl, err := s.o.ShowDeadLetter(ctx, id)
	if err != nil {
		return s.explain(ctx, err)
	}
	if f.asJSON {
		return writeJSON(e, deadLetterJSON(dl))
	}
	now := time.Now()
	w := tabwriter.NewWriter(e.stdout, 0, 4, 1, ' ', 0)
	fmt.Fprintf(w, "Dead letter %d\n", dl.ID)
	fmt.Fprintf(w, "  topic:\t%s\n", ops.EscapeControls(dl.Topic, false))
	fmt.Fprintf(w, "  uuid:\t%s\n", ops.EscapeControls(dl.UUID, false))
	fmt.Fprintf(w, "  key:\t%s\n", ops.EscapeControls(dl.Key, false))
	fmt.Fprintf(w, "  attempts:\t%d\n", dl.Attempts)
	if dl.Holds {
		fmt.Fprintf(w, "  holds key:\tyes: the key's later messages wait for its requeue or discard\n")
	}
	fmt.Fprintf(w, "  created:\t%s (%s ago)\n", dl.CreatedAt.UTC().Format(time.RFC3339), age(now.Sub(dl.CreatedAt)))
	fmt.Fprintf(w, "  died:\t%s (%s ago)\n", dl.DeadAt.UTC().Format(time.RFC3339), age(now.Sub(dl.DeadAt)))
	w.Flush()
	fmt.Fprintf(e.stdout, "  last error:\n%s\n", indent(ops.EscapeControls(dl.LastError, true)))
	var meta bytes.Buffer
	if json.Indent(&meta, dl.Metadata, "", "  ") != nil {
		meta.Reset()
		meta.Write(dl.Metadata)
	}
	fmt.Fprintf(e.stdout, "  metadata:\n%s\n", indent(ops.EscapeControls(meta.String(), true)))
	if utf8.Valid(dl.Payload) {
		fmt.Fprintf(e.stdout, "  payload (%d bytes):\n%s\n", len(dl.Payload), indent(ops.EscapeControls(string(dl.Payload), true)))
	} else {
		fmt.Fprintf(e.stdout, "  payload (%d bytes, binary):\n%s\n", len(dl.Payload), indent(hex.Dump(dl.Payload)))
	}
	fmt.Fprintf(e.stdout, "\nSend it again with: %s\n", f.hint(fmt.Sprint("dead requeue ", dl.ID)))
	return nil
}

// deadChange requeues or discards dead letters.
func deadChange(ctx context.Context, e env, f *deadFlags, sub string) error {
	verb, done := "requeue", "requeued"
	if sub == "discard" {
		verb, done = "discard", "discarded"
	}
	s, err := f.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	n, err := s.o.CountDeadLetters(ctx, f.filter)
	if err != nil {
		return s.explain(ctx, err)
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
		if f.filter.All {
			what = "(every dead letter)"
		}
		return usagef("refusing to %s %s %s without --yes; check them with: %s (or add --dry-run), and add --yes to go ahead", verb, count(n, "dead letter"), what, f.hint("dead list"+filterFlags(f.filter)))
	}
	opts := ops.ChangeOptions{BatchSize: f.batch}
	if n > int64(f.batch) {
		opts.Progress = func(changed int64) {
			fmt.Fprintf(e.stderr, "%s %d of %d\n", done, changed, n)
		}
	}
	var changed int64
	if sub == "discard" {
		changed, err = s.o.Discard(ctx, f.filter, opts)
	} else {
		changed, err = s.o.Requeue(ctx, f.filter, opts)
	}
	if err != nil {
		return fmt.Errorf("%w (%s %s before the error)", s.explain(ctx, err), done, count(changed, "dead letter"))
	}
	fmt.Fprintf(e.stdout, "%s %s\n", done, count(changed, "dead letter"))
	return nil
}

type jsonGroup struct {
	Fingerprint         string  `json:"fingerprint"`
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
	HoldsKey      bool            `json:"holds_key"`
	Metadata      json.RawMessage `json:"metadata"`
	Payload       *string         `json:"payload,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
}

// deadLetterJSON renders a dead letter, its payload as text when it is
// UTF-8 and as base64 otherwise.
func deadLetterJSON(dl sqladapters.DeadLetter) jsonDeadLetter {
	j := jsonDeadLetter{
		ID: dl.ID, Topic: dl.Topic, UUID: dl.UUID, Key: dl.Key, Attempts: dl.Attempts, LastError: dl.LastError,
		CreatedAt: dl.CreatedAt.UTC(), DeadAt: dl.DeadAt.UTC(), HoldsKey: dl.Holds, Metadata: json.RawMessage(dl.Metadata),
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

// oneLine renders a text from the database for one cell of a table: its
// first line, control characters escaped, at most n runes.
func oneLine(s string, n int) string {
	more := ""
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s, more = s[:i], " …"
	}
	s = ops.EscapeControls(strings.ReplaceAll(s, "\t", " "), false) + more
	if utf8.RuneCountInString(s) > n {
		r := []rune(s)
		s = string(r[:n-1]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

// filterFlags renders the filter flags of f, for a hint.
func filterFlags(f ops.Filter) string {
	var b strings.Builder
	for _, fl := range []struct{ name, value string }{
		{"topic", f.Topic}, {"key", f.Key}, {"error", f.ErrorContains},
		{"older-than", ageFlag{&f.OlderThan}.String()}, {"newer-than", ageFlag{&f.NewerThan}.String()},
	} {
		if fl.value != "" {
			b.WriteString(" --" + fl.name + " " + shellQuote(fl.value))
		}
	}
	return b.String()
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	return "    " + strings.ReplaceAll(s, "\n", "\n    ")
}
