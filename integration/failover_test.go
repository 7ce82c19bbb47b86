package integration_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/failover"
	"github.com/millbox/millbox/integration/testenv"
)

// runFailover runs the failover scenario on a pair of the test's own and
// fails the test on anything the scenario finds wrong, but the messages
// of publishers without a table that committed before the primary went
// away (the lost slot's), which it returns.
func runFailover(t *testing.T, s failover.Scenario) failover.Result {
	t.Helper()
	s = s.WithDefaults()
	s.Pair = testenv.StartPostgresPair(t, testenv.PostgresPairConfig{})
	s.Logger = testenv.Logger(t)
	ctx := testenv.Ctx(t, 2*time.Minute)
	res, err := failover.Run(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s/%s %s: committed %d (%d before, %d after), unknown %d, delivered %d, duplicates %d, lost %d (%d before), first commit after the promotion %v, resume %v",
		s.Mode, s.Driver, s.Ending, res.Committed, res.CommittedBefore, res.CommittedAfter, res.Unknown, res.Delivered, res.Duplicates,
		len(res.Lost), res.LostBefore, res.FirstCommit, res.Resume)
	switch {
	case res.Stopped != nil:
		t.Fatalf("the forwarder stopped: %v", res.Stopped)
	case res.CommittedBefore == 0 || res.CommittedAfter == 0:
		t.Fatalf("nothing was committed before the failover (%d) or after it (%d): nothing was tested", res.CommittedBefore, res.CommittedAfter)
	case len(res.Order) > 0:
		t.Fatalf("%d order violations: %v", len(res.Order), res.Order[:min(len(res.Order), 10)])
	case res.LostAfter() > 0:
		t.Fatalf("%d messages committed after the promotion never arrived: %v", res.LostAfter(), res.Lost[:min(len(res.Lost), 20)])
	case res.LostBefore > 0 && s.Mode != failover.WithoutTable:
		t.Fatalf("%d messages committed before the failover never arrived: %v", res.LostBefore, res.Lost[:min(len(res.Lost), 20)])
	case res.Resume < 0:
		t.Fatal("nothing arrived after the promotion")
	}
	return res
}

// TestFailoverPolling kills the primary with SIGKILL while publishers
// commit and the polling forwarder forwards, and promotes the standby:
// every message the application saw commit arrives, in per-key order, and
// the forwarder, never restarted, resumes on the new primary.
func TestFailoverPolling(t *testing.T) {
	t.Parallel()
	runFailover(t, failover.Scenario{Mode: failover.Polling})
}

// TestFailoverPollingDatabaseSQL is TestFailoverPolling through
// database/sql (pgx's stdlib driver), whose pool keeps and drops
// connections its own way.
func TestFailoverPollingDatabaseSQL(t *testing.T) {
	t.Parallel()
	runFailover(t, failover.Scenario{Mode: failover.Polling, Driver: failover.StdSQL})
}

// TestFailoverPollingFenced makes the primary read-only while sessions
// stay connected to it (a fenced old primary) and promotes the standby:
// the forwarder's and the publishers' pools drop the connections whose
// writes fail with SQLSTATE 25006, and new ones find the new primary.
func TestFailoverPollingFenced(t *testing.T) {
	t.Parallel()
	runFailover(t, failover.Scenario{Mode: failover.Polling, Ending: failover.Fence})
}

// TestFailoverPollingFencedDatabaseSQL is TestFailoverPollingFenced
// through database/sql.
func TestFailoverPollingFencedDatabaseSQL(t *testing.T) {
	t.Parallel()
	runFailover(t, failover.Scenario{Mode: failover.Polling, Ending: failover.Fence, Driver: failover.StdSQL})
}

// TestFailoverCDC kills the primary under the change-data-capture
// forwarder and promotes the standby, which has no replication slot: the
// forwarder, never restarted, recreates the slot (CreateIfMissing) and
// delivers from the table every row the lost slot had not confirmed.
func TestFailoverCDC(t *testing.T) {
	t.Parallel()
	runFailover(t, failover.Scenario{Mode: failover.CDC})
}

// TestFailoverWithoutTable kills the primary under publishers without a
// table and promotes the standby: publishers keep committing, into the
// table while no slot exists; the forwarder recreates its slot, reports
// the stretch of WAL the lost slot had not confirmed, and everything
// committed after the promotion arrives.
func TestFailoverWithoutTable(t *testing.T) {
	t.Parallel()
	var lost atomic.Pointer[cdc.SlotLostError]
	res := runFailover(t, failover.Scenario{Mode: failover.WithoutTable, Errors: func(err error) {
		if sl := (*cdc.SlotLostError)(nil); errors.As(err, &sl) {
			lost.Store(sl)
		}
	}})
	sl := lost.Load()
	if sl == nil {
		t.Fatal("the forwarder did not report the lost slot")
	}
	t.Logf("%d messages committed before the failover were lost with the slot; reported: %v", res.LostBefore, sl)
	if res.LostBefore > 0 && sl.Bytes() == 0 {
		t.Fatalf("%d messages were lost, but the reported range is empty: %v", res.LostBefore, sl)
	}
}
