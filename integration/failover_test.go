package integration_test

import (
	"database/sql"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/failover"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// runFailover runs the failover scenario on a pair of the test's own and
// fails the test on anything the scenario finds wrong, but the messages
// of publishers without a table that committed before the primary went
// away (the lost slot's), which it returns.
// failoverSlots bounds the failover tests that run at once: each starts a
// pair of PostgreSQL servers and a steady load, and eleven at once on two
// cores starve the package's other parallel tests (whose waits are
// bounded) of the CPU.
var failoverSlots = make(chan struct{}, 2)

// failoverSlot runs t in parallel with the others, two failover tests at
// a time.
func failoverSlot(t *testing.T) {
	t.Helper()
	t.Parallel()
	failoverSlots <- struct{}{}
	t.Cleanup(func() { <-failoverSlots })
}

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
	t.Logf("%s/%s %s: committed %d (%d before, %d of them left to deliver, %d after), unknown %d, delivered %d, duplicates %d, lost %d (%d before), first commit after the promotion %v, resume %v",
		s.Mode, s.Driver, s.Ending, res.Committed, res.CommittedBefore, res.Backlog, res.CommittedAfter, res.Unknown, res.Delivered, res.Duplicates,
		len(res.Lost), res.LostBefore, res.FirstCommit, res.Resume)
	switch {
	case res.Stopped != nil:
		t.Fatalf("the forwarder stopped: %v", res.Stopped)
	case res.CommittedBefore == 0 || res.CommittedAfter == 0:
		t.Fatalf("nothing was committed before the failover (%d) or after it (%d): nothing was tested", res.CommittedBefore, res.CommittedAfter)
	case len(res.Order) > 0:
		t.Fatalf("%d order violations: %v", len(res.Order), res.Order[:min(len(res.Order), 10)])
	case res.LostAfter() > 0:
		t.Fatalf("%d messages committed after the promotion never arrived: %v", res.LostAfter(), res.LostAfterDetail)
	case res.LostBefore > 0 && s.Mode != failover.WithoutTable:
		t.Fatalf("%d messages committed before the failover never arrived: %v", res.LostBefore, res.Lost[:min(len(res.Lost), 20)])
	case res.Resume < 0:
		t.Fatal("nothing arrived after the promotion")
	case !res.DownReported:
		t.Fatal("the forwarder's Status never said that its database failed while the primary was away (DatabaseDownSince)")
	case !res.DownAtEnd.IsZero():
		t.Fatalf("the forwarder's Status still says its database fails since %v after everything arrived", res.DownAtEnd)
	}
	return res
}

// TestFailoverPolling kills the primary with SIGKILL while publishers
// commit and the polling forwarder forwards, and promotes the standby:
// every message the application saw commit arrives, in per-key order, and
// the forwarder, never restarted, resumes on the new primary.
func TestFailoverPolling(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.Polling})
}

// TestFailoverPollingDatabaseSQL is TestFailoverPolling through
// database/sql (pgx's stdlib driver), whose pool keeps and drops
// connections its own way.
func TestFailoverPollingDatabaseSQL(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.Polling, Driver: failover.StdSQL})
}

// TestFailoverPollingFenced makes the primary read-only while sessions
// stay connected to it (a fenced old primary) and promotes the standby:
// the forwarder's and the publishers' pools drop the connections whose
// writes fail with SQLSTATE 25006, and new ones find the new primary.
func TestFailoverPollingFenced(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.Polling, Ending: failover.Fence})
}

// TestFailoverPollingFencedDatabaseSQL is TestFailoverPollingFenced
// through database/sql.
func TestFailoverPollingFencedDatabaseSQL(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.Polling, Ending: failover.Fence, Driver: failover.StdSQL})
}

// TestFailoverCDC kills the primary under the change-data-capture
// forwarder, which lags behind the publishers (a slow destination), and
// promotes the standby, which has no replication slot: the forwarder,
// never restarted, recreates the slot (CreateIfMissing) and delivers from
// the table every row the lost slot had not confirmed.
func TestFailoverCDC(t *testing.T) {
	failoverSlot(t)
	res := runFailover(t, failover.Scenario{Mode: failover.CDC, DestinationDelay: lag})
	if res.Backlog == 0 {
		t.Fatal("the forwarder had nothing left to deliver when the primary died: the scenario did not test a backlog")
	}
}

// lag is the destination's time per call, one call at a time, in the runs
// where the forwarder falls behind the publishers: slower than they
// commit, even on a loaded machine.
const lag = 30 * time.Millisecond

// TestFailoverWithoutTable kills the primary under publishers without a
// table, while the forwarder lags (a slow destination), and promotes the
// standby: publishers keep committing, into the table while no slot
// exists; the forwarder recreates its slot, reports the stretch of WAL
// the lost slot had not confirmed, and everything committed after the
// promotion arrives. Messages committed before the failover that the
// lost slot had not delivered are lost, as the package doc says.
func TestFailoverWithoutTable(t *testing.T) {
	failoverSlot(t)
	var lost atomic.Pointer[cdc.SlotLostError]
	res := runFailover(t, failover.Scenario{Mode: failover.WithoutTable, DestinationDelay: lag, Errors: func(err error) {
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
	if res.Backlog == 0 || res.LostBefore == 0 {
		t.Fatalf("%d messages left to deliver when the primary died, %d of them lost: the scenario did not take the slot away with unread messages", res.Backlog, res.LostBefore)
	}
}

// TestEmitWithoutSlotWritesTheTable: a publisher without a table, on a
// database where no logical slot exists at the moment of its call (a
// standby just promoted, before the forwarder created its slot there),
// writes its messages into the outbox table, whatever it found at its
// previous call: the slot is looked for by the statement that writes. A
// forwarder started afterwards delivers them from the table.
func TestEmitWithoutSlotWritesTheTable(t *testing.T) {
	failoverSlot(t)
	pair := testenv.StartPostgresPair(t, testenv.PostgresPairConfig{})
	ctx := testenv.Ctx(t, time.Minute)
	pool, err := pgxpool.New(ctx, pair.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := pgxv5.WrapPool(pool)
	name := testenv.UniqueName("fo_")
	d, err := postgres.New(postgres.Options{Schema: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	src := cdc.Source{ConnString: pair.URL(), Slot: name, Publication: name, CreateIfMissing: true}
	if err := cdc.Setup(ctx, db, d, src); err != nil {
		t.Fatal(err)
	}
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: d, WithoutTable: true, Slot: name})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(uuid string) {
		t.Helper()
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.PublishTx(ctx, tx, "failover", message.NewMessage(uuid, []byte(uuid))); err != nil {
			sqladapters.Rollback(tx)
			t.Fatalf("publish %s: %v", uuid, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pending := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+d.OutboxTable()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	publish("with-slot")
	if n := pending(); n != 0 {
		t.Fatalf("with a slot, the message went into the table (%d rows)", n)
	}
	if err := cdc.Drop(ctx, db, d, src); err != nil {
		t.Fatal(err)
	}
	publish("without-slot")
	if n := pending(); n != 1 {
		t.Fatalf("without a slot, %d rows in the table, want the message's 1: it went into a WAL no slot reads", n)
	}
	rec := conformance.NewRecorder()
	conformance.StartForwarder(t, forwarder.Config{DB: db, Dialect: d, Destination: rec, Source: src, Logger: testenv.Logger(t)})
	rec.WaitFor(t, 1, 30*time.Second)
	if got := rec.Messages(); got[0].UUID != "without-slot" {
		t.Fatalf("delivered %s, want without-slot", got[0].UUID)
	}
}

// TestSwitchoverPolling stops the primary cleanly and promotes the
// standby once it replayed everything, as a planned switchover does:
// nothing is lost, in per-key order, without a restart.
func TestSwitchoverPolling(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.Polling, Ending: failover.Switchover})
}

// TestSwitchoverCDC is TestSwitchoverPolling with the change-data-capture
// source: the slot stays on the old primary, the forwarder creates it on
// the new one and reads the rows it had not confirmed from the table.
func TestSwitchoverCDC(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.CDC, Ending: failover.Switchover})
}

// TestSwitchoverWithoutTable is TestSwitchoverCDC with publishers
// without a table.
func TestSwitchoverWithoutTable(t *testing.T) {
	failoverSlot(t)
	runFailover(t, failover.Scenario{Mode: failover.WithoutTable, Ending: failover.Switchover})
}

// TestFailoverInbox: a consumer's handler transaction commits on the
// primary, which dies before the broker's ack; the standby is promoted.
// RabbitMQ redelivers the message, the inbox middleware reaches the new
// primary through the multi-host URL, finds the message recorded there
// (synchronous replication: the commit it saw is on the standby) and
// acks it without running the handler again.
func TestFailoverInbox(t *testing.T) {
	failoverSlot(t)
	pair := testenv.StartPostgresPair(t, testenv.PostgresPairConfig{})
	b := inboxRabbit(t)
	ctx := testenv.Ctx(t, time.Minute)
	pool, err := pgxpool.New(ctx, pair.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	env := pgDialectEnv(pool)
	f := conformance.NewInboxFixture(t, env, env.DB)
	var failedOver atomic.Bool
	promoted := make(chan error, 1)
	// Outside the inbox middleware: it sees the handler's transaction
	// committed, and takes the database away before the router acks.
	failOverBeforeAck := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil || !failedOver.CompareAndSwap(false, true) {
				return out, err
			}
			if err := pair.KillPrimary(); err != nil {
				t.Error(err)
			}
			go func() {
				time.Sleep(500 * time.Millisecond)
				promoted <- pair.Promote(ctx)
			}()
			return nil, errors.New("the database failed over before the ack")
		}
	}
	conformance.StartRouter(t, func(r *message.Router) {
		r.AddMiddleware(failOverBeforeAck, f.Middleware("billing"))
		r.AddConsumerHandler("apply", b.topic, b.newSub(t), f.EffectHandler)
	})
	msg := message.NewMessage(watermill.NewUUID(), []byte("order"))
	conformance.PublishCopies(t, b.pub, b.topic, msg, 1)
	f.WaitDeliveries(2) // the run that committed, then the redelivery
	if err := <-promoted; err != nil {
		t.Fatal(err)
	}
	if h, d := f.Handled(), f.Duplicates(); h != 1 || d != 1 {
		t.Fatalf("handled %d, duplicates %d; want the handler once, the redelivery a duplicate", h, d)
	}
	// The fixture's pool may still hold a connection to the killed
	// primary: its first use fails, the next one dials the new primary.
	n, err := f.CountEffect(msg.UUID)
	for deadline := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		n, err = f.CountEffect(msg.UUID)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the new primary holds the handler's effect %d times, want 1", n)
	}
}
