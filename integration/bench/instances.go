package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("instances", "one forwarder process vs three (-instances) draining the same prefilled backlog (N, 200 keys) to a Kafka-protocol broker (kfake) in a process of its own, default settings, alternating rounds: instances3_vs_1 and each process's CPU", runInstances)
}

// The instances case runs the bench binary again as the broker and as the
// forwarders, with instChildEnv set to "broker" or "forwarder".
const (
	instChildEnv    = "MILLBOX_BENCH_INSTANCES_CHILD"
	instChildSchema = "MILLBOX_BENCH_INSTANCES_SCHEMA"
	instChildKafka  = "MILLBOX_BENCH_INSTANCES_KAFKA"
	instChildTopic  = "MILLBOX_BENCH_INSTANCES_TOPIC"
	instChildPub    = "MILLBOX_BENCH_INSTANCES_PUBLISHER"
	instChildDebug  = "MILLBOX_BENCH_INSTANCES_DEBUG" // forwarders log at debug level, and every read, to the bench's stderr
)

// runInstances measures whether more forwarder instances drain a backlog
// faster. Each side of a round prefills a fresh outbox with the same
// backlog and starts its forwarders together, each a process of its own
// with default settings and a publisher of its own, and stops when they
// have published every row (counted by each forwarder's OnBatch hook, so
// no consumer competes for the CPU). The broker runs in a process of its
// own throughout, as a real one would run on another machine. Rounds
// alternate which side goes first, so that both see about the same load
// of a shared machine; the ratio is the median of the rounds'.
//
// Every process's CPU (user+sys from its rusage), that of the forwarders'
// Postgres backends and the machine's idle share are printed, so that a
// ratio can be read against the CPU one instance leaves unused. Each
// forwarder's first published row and its rows per second show how soon
// every instance starts and how evenly it goes.
//
// MILLBOX_BENCH_INSTANCES_PUBLISHER=kafkabatch uses millbox's kafkabatch
// publisher instead of watermill-kafka's; MILLBOX_BENCH_INSTANCES_DEBUG=1
// has the forwarders log at debug level, and each read, to stderr.
func runInstances(ctx context.Context, o options) error {
	switch os.Getenv(instChildEnv) {
	case "broker":
		return instBrokerChild()
	case "forwarder":
		return instForwarderChild(o)
	}
	n := orDefault(o.n, 200000)
	many := 3
	if o.instances > 1 {
		many = o.instances
	}
	rounds := orDefault(o.rounds, 2)
	pubName := orDefault(os.Getenv(instChildPub), "watermill-kafka")
	if pubName != "watermill-kafka" && pubName != "kafkabatch" {
		return fmt.Errorf("%s=%q: want watermill-kafka or kafkabatch", instChildPub, pubName)
	}
	broker, err := startInstBroker()
	if err != nil {
		return fmt.Errorf("broker process: %w", err)
	}
	defer broker.stop()
	fmt.Printf("draining %d prefilled messages (200 keys, 256-byte payloads) from postgres to Kafka (kfake in process %d), %s publisher, default settings; 1 forwarder process vs %d; load average %s\n",
		n, broker.cmd.Process.Pid, pubName, many, loadAverage())
	var ratios []float64
	var ones, manys []float64
	for round := range rounds {
		order := []int{1, many}
		if round%2 == 1 {
			order = []int{many, 1}
		}
		rates := map[int]float64{}
		for _, k := range order {
			r, err := instDrain(ctx, o, broker, n, k, pubName)
			if err != nil {
				return fmt.Errorf("%d instance(s): %w", k, err)
			}
			rates[k] = r.rate
			r.print(round+1, k)
		}
		ratios = append(ratios, rates[many]/rates[1])
		ones, manys = append(ones, rates[1]), append(manys, rates[many])
		fmt.Printf("round %d: %d instances vs 1: %.2f (load average %s)\n", round+1, many, rates[many]/rates[1], loadAverage())
	}
	summary("instances1_msgs_per_s", int(median(ones)), fmt.Sprintf("instances%d_msgs_per_s", many), int(median(manys)),
		fmt.Sprintf("instances%d_vs_1", many), median(ratios))
	return nil
}

// instResult is one drain: its rate and where the CPU went.
type instResult struct {
	rate     float64
	rows     int
	elapsed  time.Duration
	procs    []instProc
	broker   time.Duration // the broker process's CPU during the drain
	backends time.Duration // the forwarders' Postgres backends' CPU
	idle     float64       // the machine's idle share during the drain
}

// instProc is one forwarder process's part of a drain.
type instProc struct {
	forwarded int64
	first     time.Duration // from the start to its first published row
	perSecond []int64       // rows published in each second from the start
	cpu       time.Duration // user+sys from its rusage
	wall      time.Duration // from its start to its exit
	errs      []string      // lines it logged at error level
}

func (r instResult) print(round, k int) {
	var fwd time.Duration
	for _, p := range r.procs {
		fwd += p.cpu
	}
	fmt.Printf("round %d, %d instance(s): %.0f msg/s (%v); CPU: forwarders %.2fs, their Postgres backends %.2fs (%.1f µs per row together), broker %.2fs; machine idle %.0f%%\n",
		round, k, r.rate, r.elapsed.Round(time.Millisecond), fwd.Seconds(), r.backends.Seconds(), float64((fwd+r.backends).Microseconds())/float64(r.rows),
		r.broker.Seconds(), 100*r.idle)
	for i, p := range r.procs {
		ps := make([]string, len(p.perSecond))
		for j, v := range p.perSecond {
			ps[j] = strconv.FormatInt(v, 10)
		}
		fmt.Printf("  forwarder %d: %d rows, first after %v, CPU %.2fs (user+sys) over %v; rows per second: %s\n",
			i+1, p.forwarded, p.first.Round(time.Millisecond), p.cpu.Seconds(), p.wall.Round(time.Millisecond), strings.Join(ps, " "))
		for _, e := range p.errs {
			fmt.Printf("    logged: %s\n", e)
		}
	}
}

// instDrain prefills a fresh outbox with n rows and times k forwarder
// processes draining it.
func instDrain(ctx context.Context, o options, broker *instBroker, n, k int, pubName string) (instResult, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return instResult{}, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	if err := prefill(ctx, db, d, n, 200, 256); err != nil {
		return instResult{}, err
	}
	if err := analyze(ctx, db, d, "postgres"); err != nil {
		return instResult{}, err
	}
	topic := fmt.Sprintf("instances-%d", time.Now().UnixNano())
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = testenv.DeleteKafkaTopics(ctx, []string{broker.addr}, topic)
	}()
	exe, err := os.Executable()
	if err != nil {
		return instResult{}, err
	}
	brokerStart, _ := procTicks(broker.cmd.Process.Pid)
	idleStart, totalStart := machineTicks()
	start := time.Now()
	children := make([]*instChild, k)
	for i := range children {
		c, err := startInstChild(exe, o, d.Schema(), broker.addr, topic, pubName, start)
		if err != nil {
			for _, c := range children[:i] {
				c.kill()
			}
			return instResult{}, err
		}
		children[i] = c
	}
	var elapsed time.Duration
	tick := time.NewTicker(5 * time.Millisecond)
	for {
		var total int64
		for _, c := range children {
			total += c.forwarded.Load()
		}
		if total >= int64(n) {
			elapsed = time.Since(start)
			break
		}
		var exited error
		for _, c := range children {
			select {
			case <-c.exited:
				exited = fmt.Errorf("a forwarder process exited early: %v", c.waitErr)
			default:
			}
		}
		if exited == nil {
			exited = ctx.Err()
		}
		if exited != nil {
			tick.Stop()
			for _, c := range children {
				c.kill()
			}
			return instResult{}, exited
		}
		<-tick.C
	}
	tick.Stop()
	// The forwarders' backends, before the forwarders close them: their
	// CPU since they connected, which was after the start.
	backendTicks, err := appBackendTicks(ctx, pool, topic)
	if err != nil {
		return instResult{}, err
	}
	brokerEnd, _ := procTicks(broker.cmd.Process.Pid)
	idleEnd, totalEnd := machineTicks()
	res := instResult{
		rate:     float64(n) / elapsed.Seconds(),
		rows:     n,
		elapsed:  elapsed,
		backends: time.Duration(backendTicks) * 10 * time.Millisecond,
		broker:   time.Duration(brokerEnd-brokerStart) * 10 * time.Millisecond,
	}
	if totalEnd > totalStart {
		res.idle = float64(idleEnd-idleStart) / float64(totalEnd-totalStart)
	}
	for _, c := range children {
		p, err := c.stop(elapsed)
		if err != nil {
			return instResult{}, err
		}
		res.procs = append(res.procs, p)
	}
	return res, nil
}

// appBackendTicks sums the CPU ticks of the Postgres backends whose
// application_name is name.
func appBackendTicks(ctx context.Context, pool *pgxpool.Pool, name string) (uint64, error) {
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, name)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, pid := range pids {
		if t, err := procTicks(int(pid)); err == nil {
			total += t
		}
	}
	return total, nil
}

// machineTicks returns the machine's idle and total CPU ticks so far, from
// the first line of /proc/stat.
func machineTicks() (idle, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		t, _ := strconv.ParseUint(v, 10, 64)
		if i < 8 { // user nice system idle iowait irq softirq steal; guest time is in user already
			total += t
		}
		if i == 3 || i == 4 {
			idle += t
		}
	}
	return idle, total
}

// instChild is a forwarder process of a drain.
type instChild struct {
	cmd       *exec.Cmd
	start     time.Time
	forwarded atomic.Int64
	mu        sync.Mutex
	first     time.Duration
	seconds   []int64 // cumulative count at the end of each second
	errs      []string
	exited    chan struct{}
	waitErr   error
}

func startInstChild(exe string, o options, schema, kafkaAddr, topic, pubName string, start time.Time) (*instChild, error) {
	cmd := exec.Command(exe, "-case", "instances", "-postgres", o.pgURL,
		"-batch", strconv.Itoa(o.batch), "-concurrency", strconv.Itoa(o.concurrency))
	cmd.Env = append(os.Environ(), instChildEnv+"=forwarder", instChildSchema+"="+schema,
		instChildKafka+"="+kafkaAddr, instChildTopic+"="+topic, instChildPub+"="+pubName)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &instChild{cmd: cmd, start: start, exited: make(chan struct{})}
	debug := os.Getenv(instChildDebug) != ""
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			v, ok := strings.CutPrefix(sc.Text(), "forwarded ")
			if !ok {
				continue
			}
			total, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			c.note(total)
		}
	})
	readers.Go(func() {
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			line := sc.Text()
			if debug {
				fmt.Fprintf(os.Stderr, "[%d] %s\n", cmd.Process.Pid, line)
			}
			if strings.Contains(line, "ERROR") {
				c.mu.Lock()
				if len(c.errs) < 5 {
					c.errs = append(c.errs, line)
				}
				c.mu.Unlock()
			}
		}
	})
	go func() {
		readers.Wait()
		c.waitErr = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

// note records the child's running total.
func (c *instChild) note(total int64) {
	at := time.Since(c.start)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.forwarded.Load() == 0 && total > 0 {
		c.first = at
	}
	sec := int(at / time.Second)
	for len(c.seconds) <= sec {
		prev := int64(0)
		if len(c.seconds) > 0 {
			prev = c.seconds[len(c.seconds)-1]
		}
		c.seconds = append(c.seconds, prev)
	}
	c.seconds[sec] = total
	c.forwarded.Store(total)
}

// stop ends the child with SIGTERM and returns its part of a drain that
// took elapsed.
func (c *instChild) stop(elapsed time.Duration) (instProc, error) {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(time.Minute):
		c.kill()
		return instProc{}, errors.New("a forwarder process did not stop within a minute of SIGTERM")
	}
	p := instProc{forwarded: c.forwarded.Load(), first: c.first, errs: c.errs, wall: time.Since(c.start)}
	if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		p.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var prev int64
	for i, v := range c.seconds {
		if time.Duration(i)*time.Second > elapsed {
			break
		}
		p.perSecond = append(p.perSecond, v-prev)
		prev = v
	}
	return p, nil
}

func (c *instChild) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// instForwarderChild is a forwarder process: default settings, a
// publisher of its own, until SIGTERM. It prints its running total of
// published rows every 10 ms while it changes.
func instForwarderChild(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return err
	}
	// The parent finds this drain's backends by their name.
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(instChildTopic)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := postgres.New(postgres.Options{Schema: os.Getenv(instChildSchema)})
	if err != nil {
		return err
	}
	addrs := []string{os.Getenv(instChildKafka)}
	var pub message.Publisher
	if os.Getenv(instChildPub) == "kafkabatch" {
		pub, err = kafkabatch.NewPublisher(kafkabatch.Config{Brokers: addrs, Options: testenv.KgoProducerOptions()})
	} else {
		pub, err = testenv.NewKafkaPublisher(addrs, true)
	}
	if err != nil {
		return err
	}
	defer pub.Close()
	topic := os.Getenv(instChildTopic)
	var forwarded atomic.Int64
	var logger watermill.LoggerAdapter
	var onRead func(int)
	if os.Getenv(instChildDebug) != "" {
		// Debug logs and every read, on stderr: the parent shows them.
		h := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
		logger = watermill.NewSlogLogger(h)
		onRead = func(rows int) { h.Debug("read", "rows", rows, "forwarded", forwarded.Load()) }
	}
	f, err := forwarder.New(forwarder.Config{
		Logger:      logger,
		DB:          pgxv5.WrapPool(pool),
		Dialect:     d,
		Destination: pub,
		BatchSize:   o.batch,
		Concurrency: o.concurrency,
		Topic:       func(string, *message.Message) (string, error) { return topic, nil },
		Hooks:       forwarder.Hooks{OnBatch: func(st forwarder.BatchStats) { forwarded.Add(int64(st.Forwarded)) }, OnRead: onRead},
	})
	if err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := bufio.NewWriter(os.Stdout)
		last := int64(-1)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if n := forwarded.Load(); n != last {
				last = n
				fmt.Fprintf(w, "forwarded %d\n", n)
				_ = w.Flush()
			}
		}
	}()
	err = f.Run(ctx)
	<-done
	if err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// instBroker is the broker process.
type instBroker struct {
	cmd    *exec.Cmd
	addr   string
	exited chan struct{}
}

func startInstBroker() (*instBroker, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-case", "instances")
	cmd.Env = append(os.Environ(), instChildEnv+"=broker")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	b := &instBroker{cmd: cmd, exited: make(chan struct{})}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, errors.New("the broker process exited before it told its address")
	}
	b.addr, _ = strings.CutPrefix(sc.Text(), "addr ")
	go func() {
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
		close(b.exited)
	}()
	return b, nil
}

func (b *instBroker) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = b.cmd.Process.Kill()
		<-b.exited
	}
}

// instBrokerChild runs a kfake broker until SIGTERM; it prints its address
// first.
func instBrokerChild() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Println("addr " + k.Addr())
	<-ctx.Done()
	return nil
}
