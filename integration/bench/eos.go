package main

import (
	"bufio"
	"context"
	stdsql "database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("eos", "exactly once into Kafka (kfake) vs at least once, both with kafkabatch: drain of N keyed messages, commit-to-consumer latency at 1,000 msg/s, and duplicates with 5 forced crashes of 2 forwarder processes", runEOS)
}

// The crash part runs the bench binary again as forwarder processes, with
// eosChildEnv set to "eos" or "alo".
const (
	eosChildEnv    = "MILLBOX_BENCH_EOS_CHILD"
	eosChildSchema = "MILLBOX_BENCH_EOS_SCHEMA"
	eosChildKafka  = "MILLBOX_BENCH_EOS_KAFKA"
	eosChildID     = "MILLBOX_BENCH_EOS_ID"
	eosChildDie    = "MILLBOX_BENCH_EOS_DIE_AFTER" // SIGKILL itself right after that many commits
	eosDieLine     = "dying between a Kafka commit and the delete of its rows"
)

func runEOS(ctx context.Context, o options) error {
	if mode := os.Getenv(eosChildEnv); mode != "" {
		return eosChild(o, mode)
	}
	n := orDefault(o.n, 100000)
	dur := orDefault(o.duration, 20*time.Second)
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()

	fmt.Printf("draining %d messages (200 keys, 256-byte payloads) from postgres to Kafka (kfake, 8 partitions), %d forwarder(s), kafkabatch\n", n, max(o.instances, 1))
	alo, err := eosDrain(ctx, o, k, n, false)
	if err != nil {
		return fmt.Errorf("at least once: %w", err)
	}
	fmt.Printf("at least once (Publisher):                    %8.0f msg/s\n", alo)
	eos, err := eosDrain(ctx, o, k, n, true)
	if err != nil {
		return fmt.Errorf("exactly once: %w", err)
	}
	fmt.Printf("exactly once (TxPublisher, read_committed):   %8.0f msg/s  (%.2f of at least once)\n", eos, eos/alo)

	const rate = 1000
	fmt.Printf("latency: %d msg/s, one message per transaction, for %v, commit -> arrival at a Kafka consumer\n", rate, dur)
	a50, a99, err := eosLatency(ctx, o, k, rate, dur, false)
	if err != nil {
		return fmt.Errorf("at least once latency: %w", err)
	}
	fmt.Printf("at least once: p50 %6.1f ms  p99 %6.1f ms\n", ms(a50), ms(a99))
	e50, e99, err := eosLatency(ctx, o, k, rate, dur, true)
	if err != nil {
		return fmt.Errorf("exactly once latency: %w", err)
	}
	fmt.Printf("exactly once:  p50 %6.1f ms  p99 %6.1f ms (read_committed)\n", ms(e50), ms(e99))

	const crashN, crashes = 20000, 5
	fmt.Printf("crashes: %d keyed messages at 2,000 msg/s, 2 forwarder processes, %d forced crashes (SIGKILL at a random moment, and right after a Kafka commit before the delete)\n", crashN, crashes)
	aloDups, err := eosCrashes(ctx, o, k, crashN, crashes, false)
	if err != nil {
		return fmt.Errorf("at least once crashes: %w", err)
	}
	eosDups, err := eosCrashes(ctx, o, k, crashN, crashes, true)
	if err != nil {
		return fmt.Errorf("exactly once crashes: %w", err)
	}
	fmt.Printf("duplicates: at least once %d, exactly once %d\n", aloDups, eosDups)
	summary("eos_msgs_per_s", int(eos), "alo_msgs_per_s", int(alo), "eos_vs_alo", eos/alo,
		"eos_duplicates", eosDups, "alo_duplicates", aloDups,
		"eos_p50_ms", ms(e50), "eos_p99_ms", ms(e99), "alo_p50_ms", ms(a50), "alo_p99_ms", ms(a99))
	if eosDups != 0 {
		return fmt.Errorf("exactly once: %d duplicates", eosDups)
	}
	return nil
}

// eosPublisher returns a kafkabatch publisher: transactional for the
// outbox named id, or not.
func eosPublisher(addrs []string, exactly bool, id string) (message.Publisher, error) {
	cfg := kafkabatch.Config{Brokers: addrs, Options: testenv.KgoProducerOptions()}
	if !exactly {
		return kafkabatch.NewPublisher(cfg)
	}
	return kafkabatch.NewTxPublisher(kafkabatch.TxConfig{Config: cfg, TransactionalID: id, ControlTopic: "progress-" + id})
}

// eosCollector reads topic as its consumers would: read_committed for
// exactly once.
func eosCollector(addrs []string, topic string, exactly bool) (*testenv.KafkaCollector, error) {
	if exactly {
		return testenv.NewKafkaCommittedCollector(addrs, topic)
	}
	return testenv.NewKafkaCollector(addrs, topic)
}

// eosDrain prefills n messages into a fresh outbox and times o.instances
// forwarders draining them to a fresh topic.
func eosDrain(ctx context.Context, o options, k *testenv.Kafka, n int, exactly bool) (float64, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return 0, err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return 0, err
	}
	topic := fmt.Sprintf("eos-%d", time.Now().UnixNano())
	col, err := eosCollector(k.Addrs(), topic, exactly)
	if err != nil {
		return 0, err
	}
	defer col.Close()
	pub, err := eosPublisher(k.Addrs(), exactly, topic)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	var fs []*forwarder.Forwarder
	for range max(o.instances, 1) {
		f, err := forwarder.New(forwarder.Config{
			DB: db, Dialect: d, Destination: pub, ExactlyOnce: exactly,
			BatchSize: o.batch, Concurrency: o.concurrency,
			Topic: func(string, *message.Message) (string, error) { return topic, nil },
		})
		if err != nil {
			return 0, err
		}
		fs = append(fs, f)
	}
	errc := make(chan error, len(fs))
	start := time.Now()
	for _, f := range fs {
		go func() { errc <- f.Run(ctx) }()
	}
	werr := col.WaitN(ctx, n, 10*time.Minute)
	elapsed := col.LastFirstArrival().Sub(start)
	for _, f := range fs {
		_ = f.Close()
	}
	for range fs {
		if err := <-errc; err != nil {
			return 0, err
		}
	}
	if werr != nil {
		return 0, werr
	}
	if d := col.Duplicates(); d != 0 && exactly {
		return 0, fmt.Errorf("%d duplicates", d)
	}
	return float64(n) / elapsed.Seconds(), nil
}

// eosLatency commits rate messages per second for dur while a forwarder
// sends them to Kafka, and returns p50 and p99 of commit-to-arrival at a
// consumer (read_committed for exactly once).
func eosLatency(ctx context.Context, o options, k *testenv.Kafka, rate int, dur time.Duration, exactly bool) (p50, p99 time.Duration, err error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	topic := fmt.Sprintf("eos-latency-%d", time.Now().UnixNano())
	col, err := eosCollector(k.Addrs(), topic, exactly)
	if err != nil {
		return 0, 0, err
	}
	defer col.Close()
	pub, err := eosPublisher(k.Addrs(), exactly, topic)
	if err != nil {
		return 0, 0, err
	}
	defer pub.Close()
	f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, ExactlyOnce: exactly})
	if err != nil {
		return 0, 0, err
	}
	return forwardedLatency(ctx, f, db, d, topic, col.Collection, rate, dur)
}

// eosCrashes streams n keyed messages through two forwarder processes
// and forces crashes of them, alternately a SIGKILL at a random moment and
// a process that kills itself right after a commit (before the delete of
// its rows), and returns the duplicates a consumer saw (read_committed for
// exactly once).
func eosCrashes(ctx context.Context, o options, k *testenv.Kafka, n, crashes int, exactly bool) (int, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	mode := map[bool]string{true: "eos", false: "alo"}[exactly]
	id := fmt.Sprintf("crash-%s-%d", mode, time.Now().UnixNano())
	col, err := eosCollector(k.Addrs(), id, exactly)
	if err != nil {
		return 0, err
	}
	defer col.Close()
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	var deaths atomic.Int64
	start := func(dieAfter int) (*exec.Cmd, chan struct{}, error) {
		cmd := exec.Command(exe, "-case", "eos", "-postgres", o.pgURL)
		cmd.Env = append(os.Environ(), eosChildEnv+"="+mode, eosChildSchema+"="+d.Schema(), eosChildKafka+"="+k.Addr(),
			eosChildID+"="+id, eosChildDie+"="+strconv.Itoa(dieAfter))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		cmd.Stderr = io.Discard
		if err := cmd.Start(); err != nil {
			return nil, nil, err
		}
		exited := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if strings.Contains(sc.Text(), eosDieLine) {
					deaths.Add(1)
				}
			}
			_ = cmd.Wait()
			close(exited)
		}()
		return cmd, exited, nil
	}
	type proc struct {
		cmd    *exec.Cmd
		exited chan struct{}
	}
	var procs [2]proc
	for i := range procs {
		cmd, exited, err := start(0)
		if err != nil {
			return 0, err
		}
		procs[i] = proc{cmd, exited}
	}
	defer func() {
		for _, p := range procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(40 * time.Second):
				_ = p.cmd.Process.Kill()
				<-p.exited
			}
		}
	}()
	var written atomic.Int64
	wdone := make(chan error, 1)
	go func() { wdone <- eosStream(ctx, db, d, id, 200, n/200, 2000, &written) }()
	kills := 0
	for i := range crashes {
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Millisecond)
		s := rand.IntN(2)
		_ = procs[s].cmd.Process.Kill()
		<-procs[s].exited
		dieAfter := 0
		if i%2 == 1 {
			dieAfter = 1 + rand.IntN(3)
		} else {
			kills++
		}
		cmd, exited, err := start(dieAfter)
		if err != nil {
			return 0, err
		}
		procs[s] = proc{cmd, exited}
		if dieAfter > 0 {
			select {
			case <-exited:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			if cmd, exited, err = start(0); err != nil {
				return 0, err
			}
			procs[s] = proc{cmd, exited}
		}
		fmt.Printf("  %s: crash %d/%d, %d written, %d delivered, %d duplicates so far\n", mode, i+1, crashes, written.Load(), col.Distinct(), col.Duplicates())
	}
	if err := <-wdone; err != nil {
		return 0, err
	}
	if err := col.WaitN(ctx, n, 3*time.Minute); err != nil {
		return 0, err
	}
	time.Sleep(time.Second) // late duplicates
	fmt.Printf("  %s: %d messages, %d SIGKILLs at random, %d deaths between commit and delete, %d duplicates\n",
		mode, n, kills, deaths.Load(), col.Duplicates())
	return col.Duplicates(), nil
}

// eosStream commits perKey messages to each of keys keys, one transaction
// per round, at about rate messages per second.
func eosStream(ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, keys, perKey, rate int, written *atomic.Int64) error {
	start := time.Now()
	body := make([]byte, 256)
	for s := range perKey {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
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
			m := message.NewMessage(watermill.NewUUID(), body)
			m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(k))
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

// eosChild is a forwarder process of eosCrashes, until SIGTERM.
func eosChild(o options, mode string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, o.pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := postgres.New(postgres.Options{Schema: os.Getenv(eosChildSchema)})
	if err != nil {
		return err
	}
	exactly := mode == "eos"
	pub, err := eosPublisher([]string{os.Getenv(eosChildKafka)}, exactly, os.Getenv(eosChildID))
	if err != nil {
		return err
	}
	defer pub.Close()
	dieAfter, _ := strconv.Atoi(os.Getenv(eosChildDie))
	var commits atomic.Int64
	f, err := forwarder.New(forwarder.Config{
		DB: pgxv5.WrapPool(pool), Dialect: d, Destination: pub, ExactlyOnce: exactly,
		Source: forwarder.Polling{LeaseTTL: time.Second},
		Logger: watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
		Hooks: forwarder.Hooks{OnBatch: func(st forwarder.BatchStats) {
			if st.Forwarded > 0 && commits.Add(1) == int64(dieAfter) {
				fmt.Println(eosDieLine)
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the process dies once another thread handles the signal; this one goes no further
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
