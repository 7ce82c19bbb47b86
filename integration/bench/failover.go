package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"time"

	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/failover"
	"github.com/millbox/millbox/integration/testenv"
)

func init() {
	register("failover", "a PostgreSQL primary killed with SIGKILL under a steady load (-n msg/s, default 200, 50 keys) and its synchronous standby promoted, then a clean switchover, on a pair of the bench's own (PostgreSQL server binaries): polling, change data capture, and CDC with publishers without a table, never restarted: messages lost, duplicates, promotion to first delivery from the new primary; -duration is the publishing before and after (default 5s), -down the primary's absence, -runs the runs of each", runFailover)
}

var (
	failoverDown = flag.Duration("down", time.Second, "failover: time from the primary's end to the promotion")
	failoverRuns = flag.Int("runs", 2, "failover: runs of each mode and ending")
)

// failoverLag is the destination's time per call in the lagging runs:
// one call at a time, so that the forwarder falls behind the publishers
// and the slot has unconfirmed messages when the primary dies.
const failoverLag = 10 * time.Millisecond

func runFailover(ctx context.Context, o options) error {
	defer testenv.RemovePostgresTemplate()
	rate := orDefault(o.n, 200)
	phase := orDefault(o.duration, 5*time.Second)
	fmt.Printf("failover: %d msg/s over 50 keys, %v of publishing before and after, the primary away %v before the promotion, %d run(s) each; forwarders never restarted\n",
		rate, phase, *failoverDown, *failoverRuns)
	type variant struct {
		name   string
		mode   failover.Mode
		ending failover.Ending
		lag    time.Duration
	}
	var variants []variant
	for _, e := range []failover.Ending{failover.Kill, failover.Switchover} {
		for _, m := range []failover.Mode{failover.Polling, failover.CDC, failover.WithoutTable} {
			variants = append(variants, variant{name: string(m) + "/" + string(e), mode: m, ending: e})
		}
	}
	// The forwarder behind the publishers when the primary dies: the
	// table holds what the slot had not confirmed; without a table it is
	// lost.
	variants = append(variants,
		variant{name: "cdc/kill/lagging", mode: failover.CDC, ending: failover.Kill, lag: failoverLag},
		variant{name: "without_table/kill/lagging", mode: failover.WithoutTable, ending: failover.Kill, lag: failoverLag})

	var lost, dups, walOnlyLost int
	var resumes []time.Duration
	byMode := map[failover.Mode][]time.Duration{}
	for _, v := range variants {
		for run := range *failoverRuns {
			pair, err := testenv.NewPostgresPair(testenv.PostgresPairConfig{})
			if err != nil {
				return err
			}
			var slotLost string
			res, err := failover.Run(ctx, failover.Scenario{
				Pair: pair, Mode: v.mode, Ending: v.ending, Rate: rate, Before: phase, Down: *failoverDown, After: phase,
				DestinationDelay: v.lag,
				Errors: func(err error) {
					if sl := slotLostOf(err); sl != "" {
						slotLost = sl
					}
				},
			})
			pair.Close()
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			if res.Stopped != nil {
				return fmt.Errorf("%s: the forwarder stopped: %w", v.name, res.Stopped)
			}
			walOnly := 0
			if v.mode == failover.WithoutTable {
				walOnly = res.LostBefore
				walOnlyLost += walOnly
			}
			lost += len(res.Lost) - walOnly
			dups += res.Duplicates
			if v.lag == 0 {
				resumes = append(resumes, res.Resume)
				byMode[v.mode] = append(byMode[v.mode], res.Resume)
			}
			fmt.Printf("  %-27s run %d: committed %5d (%d before, %d of them not delivered yet when the primary went away; %d after), unknown %d, lost %d, wal-only lost %d, duplicates %d, order violations %d, first commit after the promotion %s, first delivery %s\n",
				v.name, run+1, res.Committed, res.CommittedBefore, res.Backlog, res.CommittedAfter, res.Unknown, len(res.Lost)-walOnly, walOnly,
				res.Duplicates, len(res.Order), msOf(res.FirstCommit), msOf(res.Resume))
			if slotLost != "" {
				fmt.Printf("    reported: %s\n", slotLost)
			}
		}
	}
	fmt.Println("promotion → first delivery from the new primary (runs without lag):")
	for _, m := range []failover.Mode{failover.Polling, failover.CDC, failover.WithoutTable} {
		fmt.Printf("  %-14s %s\n", m, spread(byMode[m]))
	}
	summary("failover_lost", lost, "failover_duplicates", dups, "failover_resume_ms", maxMs(resumes),
		"polling_resume_ms", maxMs(byMode[failover.Polling]), "cdc_resume_ms", maxMs(byMode[failover.CDC]),
		"without_table_resume_ms", maxMs(byMode[failover.WithoutTable]),
		"failover_wal_only_lost", walOnlyLost)
	return nil
}

// slotLostOf returns what a cdc.SlotLostError reports, or "".
func slotLostOf(err error) string {
	var sl *cdc.SlotLostError
	if !errors.As(err, &sl) {
		return ""
	}
	return fmt.Sprintf("slot lost from %v to %v (%d bytes of WAL), timeline %d → %d",
		lsn(sl.From), lsn(sl.To), sl.Bytes(), sl.PreviousTimeline, sl.Timeline)
}

// lsn formats a WAL position as PostgreSQL does.
func lsn(v uint64) string { return fmt.Sprintf("%X/%X", v>>32, uint32(v)) }

func msOf(d time.Duration) string {
	if d < 0 {
		return "none"
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}

// maxMs is the longest of ds in milliseconds, -1 when one is missing.
func maxMs(ds []time.Duration) int64 {
	var m int64
	for _, d := range ds {
		if d < 0 {
			return -1
		}
		m = max(m, d.Milliseconds())
	}
	return m
}

// spread prints the runs' durations, shortest first.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	out := ""
	for i, d := range s {
		if i > 0 {
			out += ", "
		}
		out += msOf(d)
	}
	return out
}
