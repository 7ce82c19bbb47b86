package integration_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// eosChildEnv makes TestMain run eosChild instead of the tests: a
// forwarder in exactly-once mode, in a process of its own that a test
// kills, stops and resumes. The child reads its settings from MILLBOX_EOS_*
// variables (see eosChild).
const eosChildEnv = "MILLBOX_EOS_CHILD"

// Lines a child prints for its parent.
const (
	eosLineDie    = "EOS-DIE: between the Kafka commit and the delete"
	eosLineStop   = "EOS-STOP: inside an open transaction"
	eosLineActive = "EOS-ACTIVE"
)

// eosChild runs an exactly-once forwarder until SIGTERM. Settings:
//
//	MILLBOX_EOS_SCHEMA     the Postgres schema of the outbox
//	MILLBOX_EOS_KAFKA      the broker
//	MILLBOX_EOS_ID         the TransactionalID; the control topic is progress-ID
//	MILLBOX_EOS_TOPIC      the data topic
//	MILLBOX_EOS_SLOT       a replication slot: the CDC source; else polling
//	MILLBOX_EOS_PARTITIONS polling partitions (default 8)
//	MILLBOX_EOS_DIE_AFTER  SIGKILL itself right after its nth commit, before the rows are deleted
//	MILLBOX_EOS_STOP_AFTER SIGSTOP itself after n commits, as soon as the broker acknowledged a produce of the next transaction
//	MILLBOX_EOS_DELIVERY   kafkabatch DeliveryTimeout (default 5s)
func eosChild() error {
	ctx, stop := signalContext()
	defer stop()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	db := pgxv5.WrapPool(pool)
	d, err := postgres.New(postgres.Options{Schema: os.Getenv("MILLBOX_EOS_SCHEMA")})
	if err != nil {
		return err
	}
	topic, id := os.Getenv("MILLBOX_EOS_TOPIC"), os.Getenv("MILLBOX_EOS_ID")
	envInt := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
			return v
		}
		return def
	}
	dieAfter, stopAfter := int64(envInt("MILLBOX_EOS_DIE_AFTER", 0)), int64(envInt("MILLBOX_EOS_STOP_AFTER", 0))
	var commits atomic.Int64
	var armed atomic.Bool
	opts := append(testenv.KgoProducerOptions(), kgo.WithHooks(stopInTx{topic: topic, armed: &armed}))
	pub, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{
		Config: kafkabatch.Config{
			Brokers:         []string{os.Getenv("MILLBOX_EOS_KAFKA")},
			DeliveryTimeout: time.Duration(envInt("MILLBOX_EOS_DELIVERY", 5)) * time.Second,
			Options:         opts,
		},
		TransactionalID:    id,
		ControlTopic:       "progress-" + id,
		TransactionTimeout: 2 * time.Minute,
	})
	if err != nil {
		return err
	}
	defer pub.Close()
	var src forwarder.Source = forwarder.Polling{Partitions: envInt("MILLBOX_EOS_PARTITIONS", 8), LeaseTTL: time.Second}
	var onActive func(bool)
	if slot := os.Getenv("MILLBOX_EOS_SLOT"); slot != "" {
		src = cdc.Source{ConnString: testenv.PostgresURL(), Slot: slot, Publication: slot, StandbyRetry: 100 * time.Millisecond}
		onActive = func(active bool) {
			if active {
				fmt.Println(eosLineActive)
			}
		}
	}
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
	f, err := forwarder.New(forwarder.Config{
		DB: db, Dialect: d, Destination: pub, ExactlyOnce: true, Source: conformance.PollEvery(src, 50*time.Millisecond),
		DelayedPollInterval: 50 * time.Millisecond, PublishTimeout: 3 * time.Minute,
		Retry:  forwarder.ExponentialRetry{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Logger: logger,
		Hooks: forwarder.Hooks{OnActive: onActive, OnBatch: func(st forwarder.BatchStats) {
			if st.Forwarded == 0 {
				return
			}
			n := commits.Add(1)
			if n == dieAfter {
				// The transaction committed; its rows are handed to
				// the deleter after this hook returns.
				fmt.Println(eosLineDie)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the process dies once another thread handles the signal; this one goes no further
			}
			if stopAfter > 0 && n >= stopAfter {
				armed.Store(true)
			}
		}},
	})
	if err != nil {
		return err
	}
	if err := f.Run(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// stopInTx stops the process (SIGSTOP) once armed, when the broker
// acknowledged a record of the data topic: kgo calls this hook before the
// record's promise, so the transaction's produce has not returned, and the
// commit cannot have been sent.
type stopInTx struct {
	topic string
	armed *atomic.Bool
}

func (s stopInTx) OnProduceRecordUnbuffered(r *kgo.Record, err error) {
	if err == nil && r.Topic == s.topic && s.armed.CompareAndSwap(true, false) {
		// The process stops once another thread handles the signal:
		// this one waits until it was continued.
		cont := make(chan os.Signal, 1)
		signal.Notify(cont, syscall.SIGCONT)
		defer signal.Stop(cont)
		fmt.Println(eosLineStop)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
		<-cont
	}
}

// eosProc is a child process running eosChild.
type eosProc struct {
	cmd    *exec.Cmd
	exited chan struct{}
	lines  chan string // lines with one of the eosLine markers
	active atomic.Bool // CDC: the active reader
	mu     sync.Mutex
	log    []string // lines the parent waits for (see waitLine)
}

// startEOSChild starts a child with env; its output goes to the test's
// log.
func startEOSChild(t *testing.T, env []string) *eosProc {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(append(os.Environ(), eosChildEnv+"=1"), env...)
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &eosProc{cmd: cmd, exited: make(chan struct{}), lines: make(chan string, 100)}
	logw := testenv.LogWriter(t, fmt.Sprintf("forwarder %d: ", cmd.Process.Pid))
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(r)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = io.WriteString(logw, line+"\n")
			p.mu.Lock()
			p.log = append(p.log, line)
			p.mu.Unlock()
			if line == eosLineActive {
				p.active.Store(true)
			}
			if strings.HasPrefix(line, "EOS-") {
				select {
				case p.lines <- line:
				default:
				}
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		_ = w.Close()
		<-scanned
		close(p.exited)
	}()
	t.Cleanup(p.kill)
	return p
}

// kill ends the process with SIGKILL and waits for it.
func (p *eosProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// stop ends the process with SIGTERM and waits for it.
func (p *eosProc) stop(t *testing.T) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(40 * time.Second):
		t.Errorf("forwarder %d did not stop within 40s of SIGTERM", p.cmd.Process.Pid)
		p.kill()
	}
}

func (p *eosProc) dead() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// waitLine waits until the process printed a line containing s.
func (p *eosProc) waitLine(s string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		p.mu.Lock()
		for _, l := range p.log {
			if strings.Contains(l, s) {
				p.mu.Unlock()
				return true
			}
		}
		p.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// stopped tells whether the process is stopped (SIGSTOP).
func (p *eosProc) stopped() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && (f[0] == "T" || f[0] == "t")
}

// writeKeyedStream commits perKey messages to each of keys keys, one
// transaction per round (one message per key, seq = the round), at about
// rate messages per second.
func writeKeyedStream(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, keys, perKey, rate int, written *atomic.Int64) error {
	start := time.Now()
	for s := range perKey {
		tx, err := db.Begin(ctx, sqlTxOptions)
		if err != nil {
			return err
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			sqladapters.Rollback(tx)
			return err
		}
		msgs := make([]*message.Message, keys)
		for k := range keys {
			m := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("k%d-%d", k, s)))
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, fmt.Sprintf("key-%d", k))
			m.Metadata.Set("seq", strconv.Itoa(s))
			msgs[k] = m
		}
		if err := pub.Publish(topic, msgs...); err != nil {
			sqladapters.Rollback(tx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		n := written.Add(int64(keys))
		if ahead := time.Duration(float64(n)/float64(rate)*float64(time.Second)) - time.Since(start); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	return nil
}

// eosLong tells that the long versions of the exactly-once tests run.
func eosLong() bool { return os.Getenv("MILLBOX_LONG") == "1" }

// TestExactlyOnceKafkaCrash kills exactly-once forwarders, two instances
// sharing the outbox in child processes, while a keyed stream flows: with
// SIGKILL at random moments, and at the exact point between a Kafka commit
// and the delete of its rows (the child kills itself from the OnBatch
// hook). A read_committed consumer sees every message exactly once, each
// key in order. MILLBOX_LONG=1 runs 50,000 messages and 20 kills.
func TestExactlyOnceKafkaCrash(t *testing.T) { testExactlyOnceCrash(t, false) }

// TestExactlyOnceKafkaCrashCDC is TestExactlyOnceKafkaCrash with the CDC
// source: the active reader is killed and a standby takes over.
func TestExactlyOnceKafkaCrashCDC(t *testing.T) { testExactlyOnceCrash(t, true) }

func testExactlyOnceCrash(t *testing.T, cdcMode bool) {
	n, kills, rate := 5000, 8, 400
	if eosLong() {
		n, kills, rate = 50000, 20, 2000
	}
	const keys = 100
	pool, db, d := eosPostgres(t)
	k := testenv.StartKafka(t)
	topic, id := testenv.UniqueName("eoscrash_"), testenv.UniqueName("outbox-")
	c := testenv.CollectKafkaCommitted(t, k.Addrs(), topic)
	ctx := testenv.Ctx(t, 10*time.Minute)
	env := []string{"MILLBOX_EOS_SCHEMA=" + d.Schema(), "MILLBOX_EOS_KAFKA=" + k.Addr(), "MILLBOX_EOS_ID=" + id, "MILLBOX_EOS_TOPIC=" + topic}
	if cdcMode {
		slot := testenv.UniqueName("mbeos_")
		t.Cleanup(func() { dropSlot(t, pool, slot) }) // after the children are gone
		if err := cdc.Setup(ctx, db, d, cdc.Source{Slot: slot, Publication: slot}); err != nil {
			t.Fatal(err)
		}
		env = append(env, "MILLBOX_EOS_SLOT="+slot)
	}
	var dies, sigkills int
	start := func(extra ...string) *eosProc { return startEOSChild(t, append(cloneEnv(env), extra...)) }
	procs := []*eosProc{start(), start()}
	// busy returns the instance to kill: with CDC the active reader.
	busy := func() int {
		if !cdcMode {
			return rand.IntN(2)
		}
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			for i, p := range procs {
				if p.active.Load() && !p.dead() {
					return i
				}
			}
		}
		t.Fatal("no forwarder became the active reader within 20s")
		return 0
	}

	var written atomic.Int64
	wdone := make(chan error, 1)
	go func() { wdone <- writeKeyedStream(ctx, db, d, topic, keys, n/keys, rate, &written) }()
	progress := func(what string) {
		t.Logf("%s: %d written, %d delivered, %d SIGKILLs, %d deaths between commit and delete", what, written.Load(), c.Distinct(), sigkills, dies)
	}
	for i := range kills {
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Millisecond)
		b := busy()
		if i%2 == 0 {
			procs[b].kill()
			sigkills++
			procs[b] = start()
			progress(fmt.Sprintf("kill %d/%d (SIGKILL)", i+1, kills))
			continue
		}
		// The other instance restarts to die right after one of its
		// first commits; with CDC it becomes the active reader when the
		// active one is killed.
		o := 1 - b
		procs[o].kill()
		procs[o] = start("MILLBOX_EOS_DIE_AFTER=" + strconv.Itoa(1+rand.IntN(3)))
		if cdcMode {
			procs[b].kill()
			sigkills++
			for !procs[o].active.Load() && !procs[o].dead() && ctx.Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
			procs[b] = start()
		}
		select {
		case <-procs[o].exited:
			dies++
		case <-time.After(20 * time.Second):
			procs[o].kill()
			sigkills++
		}
		procs[o] = start()
		progress(fmt.Sprintf("kill %d/%d (between commit and delete)", i+1, kills))
	}
	if err := <-wdone; err != nil {
		t.Fatal(err)
	}
	progress("written")
	checkExactlyOnce(t, c, n, 3*time.Minute)
	progress("delivered")
	if dies == 0 {
		t.Fatal("no forwarder died between a commit and its delete: the test proves less than it says")
	}
	for _, p := range procs {
		p.stop(t)
	}
	if left := pendingCount(t, pool, d); left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}

func cloneEnv(s []string) []string { return append([]string(nil), s...) }

func pendingCount(t *testing.T, pool *pgxpool.Pool, d *postgres.Dialect) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+d.OutboxTable()).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExactlyOnceKafkaLeaseMoved: the holder of the outbox's only partition
// is stopped (SIGSTOP) inside an open transaction; another forwarder takes
// the partition once the lease ran out and publishes the rows; the old
// holder resumes, and its commit fails: it was fenced. Nothing arrives
// twice.
func TestExactlyOnceKafkaLeaseMoved(t *testing.T) {
	testExactlyOnceLeaseMoved(t, false)
}

// TestExactlyOnceKafkaLeaseMovedCDC is TestExactlyOnceKafkaLeaseMoved with
// the CDC source: the stopped process's replication connection stays up,
// so it keeps the slot; the test kills its connection from the server
// (as a network partition would end it) and the standby takes over.
func TestExactlyOnceKafkaLeaseMovedCDC(t *testing.T) {
	testExactlyOnceLeaseMoved(t, true)
}

func testExactlyOnceLeaseMoved(t *testing.T, cdcMode bool) {
	const keys, perKey = 20, 50
	pool, db, d := eosPostgres(t)
	k := testenv.StartKafka(t)
	topic, id := testenv.UniqueName("eosstop_"), testenv.UniqueName("outbox-")
	c := testenv.CollectKafkaCommitted(t, k.Addrs(), topic)
	ctx := testenv.Ctx(t, 5*time.Minute)
	env := []string{"MILLBOX_EOS_SCHEMA=" + d.Schema(), "MILLBOX_EOS_KAFKA=" + k.Addr(), "MILLBOX_EOS_ID=" + id, "MILLBOX_EOS_TOPIC=" + topic,
		"MILLBOX_EOS_PARTITIONS=1", "MILLBOX_EOS_DELIVERY=60"}
	var slot string
	if cdcMode {
		slot = testenv.UniqueName("mbeos_")
		t.Cleanup(func() { dropSlot(t, pool, slot) })
		if err := cdc.Setup(ctx, db, d, cdc.Source{Slot: slot, Publication: slot}); err != nil {
			t.Fatal(err)
		}
		env = append(env, "MILLBOX_EOS_SLOT="+slot)
	}
	old := startEOSChild(t, append(cloneEnv(env), "MILLBOX_EOS_STOP_AFTER=3"))
	var written atomic.Int64
	wdone := make(chan error, 1)
	go func() { wdone <- writeKeyedStream(ctx, db, d, topic, keys, perKey, 200, &written) }()
	if !old.waitLine(eosLineStop, time.Minute) {
		t.Fatal("the forwarder never stopped inside a transaction")
	}
	for deadline := time.Now().Add(10 * time.Second); !old.stopped(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forwarder said it stops, and did not")
		}
	}
	t.Logf("stopped inside a transaction, %d messages delivered", c.Distinct())
	if cdcMode {
		// The slot and the leadership lock live as long as the stopped
		// process's connection: end it as a network failure would.
		if _, err := pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, "millbox_cdc_"+slot); err != nil {
			t.Fatal(err)
		}
	}
	taker := startEOSChild(t, env)
	if err := <-wdone; err != nil {
		t.Fatal(err)
	}
	if err := c.WaitN(ctx, keys*perKey, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("the new holder delivered all %d messages; resuming the old one", keys*perKey)
	if err := old.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	fenced := old.waitLine("commit a transaction of partition 0 (outcome unknown): "+forwarder.ErrFenced.Error(), 30*time.Second)
	checkExactlyOnce(t, c, keys*perKey, time.Minute)
	if !fenced {
		t.Fatal("the resumed forwarder did not report its commit failing as fenced")
	}
	old.stop(t)
	taker.stop(t)
	if left := pendingCount(t, pool, d); left != 0 {
		t.Fatalf("%d rows left in the outbox", left)
	}
}
