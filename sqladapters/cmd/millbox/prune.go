package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/millbox/millbox/sqladapters/ops"
)

func pruneCmd(ctx context.Context, e env, args []string) error {
	fs := newFlagSet(e, "prune", pruneUsage)
	var c common
	c.register(fs)
	var opts ops.PruneOptions
	fs.Var(ageFlag{&opts.ForwardedOlderThan}, "forwarded-older-than", "delete forwarded rows kept for audit published longer ago than this (1d, 36h, 7d)")
	fs.Var(ageFlag{&opts.InboxOlderThan}, "inbox-older-than", "delete inbox records received longer ago than this (30d)")
	fs.IntVar(&opts.BatchSize, "batch", ops.DefaultBatchSize, "rows deleted per statement")
	dryRun := fs.Bool("dry-run", false, "count what would be deleted, delete nothing")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("prune takes no arguments, got %q", pos[0])
	}
	if opts.ForwardedOlderThan == 0 && opts.InboxOlderThan == 0 {
		return usagef("prune needs --forwarded-older-than, --inbox-older-than or both; run 'millbox help prune'")
	}
	if opts.BatchSize < 1 || opts.BatchSize > ops.MaxBatchSize {
		return usagef("--batch must be between 1 and %d", ops.MaxBatchSize)
	}
	s, err := c.connect(ctx, e, false)
	if err != nil {
		return err
	}
	defer s.close()
	if *dryRun {
		n, err := s.o.PruneCount(ctx, opts)
		if err != nil {
			return s.explain(ctx, err)
		}
		if opts.ForwardedOlderThan > 0 {
			fmt.Fprintf(e.stdout, "would delete %s\n", count(n.Forwarded, "forwarded row"))
		}
		if opts.InboxOlderThan > 0 {
			fmt.Fprintf(e.stdout, "would delete %s\n", count(n.InboxRecords, "inbox record"))
		}
		fmt.Fprintln(e.stdout, "(dry run: nothing deleted)")
		return nil
	}
	opts.Progress = newProgress(e.stderr).report
	res, err := s.o.Prune(ctx, opts)
	if err != nil {
		return fmt.Errorf("%w (deleted %d forwarded rows and %d inbox records before the error)", s.explain(ctx, err), res.Forwarded, res.InboxRecords)
	}
	if opts.ForwardedOlderThan > 0 {
		fmt.Fprintf(e.stdout, "deleted %s\n", count(res.Forwarded, "forwarded row"))
	}
	if opts.InboxOlderThan > 0 {
		fmt.Fprintf(e.stdout, "deleted %s\n", count(res.InboxRecords, "inbox record"))
	}
	return nil
}

// progressLine renders a progress report as a bar:
//
//	forwarded [#########...........]  45% 4500/10000
func progressLine(p ops.PruneProgress) string {
	const width = 20
	frac := 1.0
	if p.Total > 0 {
		frac = min(float64(p.Deleted)/float64(p.Total), 1)
	}
	fill := int(frac * width)
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = '.'
		if i < fill {
			bar[i] = '#'
		}
	}
	state := ""
	if p.Done {
		state = " done"
	}
	return fmt.Sprintf("%-9s [%s] %3.0f%% %d/%d%s", p.Table, bar, frac*100, p.Deleted, p.Total, state)
}

// progress prints prune progress on stderr: one bar redrawn in place on a
// terminal, and otherwise (logs of a scheduled job) a line per tenth of
// the way and one at the end.
type progress struct {
	w         io.Writer
	tty       bool
	lastTenth int64
}

func newProgress(w io.Writer) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil {
			tty = fi.Mode()&os.ModeCharDevice != 0
		}
	}
	return &progress{w: w, tty: tty, lastTenth: -1}
}

func (p *progress) report(r ops.PruneProgress) {
	line := progressLine(r)
	if p.tty {
		end := ""
		if r.Done {
			end = "\n"
		}
		fmt.Fprint(p.w, "\r"+line+end)
		return
	}
	tenth := int64(10)
	if r.Total > 0 {
		tenth = min(r.Deleted*10/r.Total, 10)
	}
	if r.Deleted == 0 && !r.Done {
		p.lastTenth = -1 // a new table starts
	}
	if r.Done || tenth != p.lastTenth {
		fmt.Fprintln(p.w, line)
		p.lastTenth = tenth
	}
}
