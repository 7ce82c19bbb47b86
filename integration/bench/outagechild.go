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
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/forwarder/kafkabatch"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// childCounters are the forwarder child's running totals.
type childCounters struct {
	reads, rows, errors, failed, forwarded int64
	openReads, openRows                    int64 // reads while the breaker was open
}

const childCountersFormat = "reads=%d rows=%d errors=%d failed=%d forwarded=%d open_reads=%d open_rows=%d\n"

// forwarderChild is the forwarder's process.
type forwarderChild struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	mu     sync.Mutex // one request at a time on stdin/stdout
	out    *bufio.Scanner
	logs   chan struct{}
	once   sync.Once
	waited error
	// breaker opened and closed, from the child's log
	opens, closes atomic.Int64
	openMu        sync.Mutex
	openedAt      []time.Time
}

// openedAfter returns when the breaker first opened after t, zero if not.
func (c *forwarderChild) openedAfter(t time.Time) time.Time {
	c.openMu.Lock()
	defer c.openMu.Unlock()
	for _, at := range c.openedAt {
		if at.After(t) {
			return at
		}
	}
	return time.Time{}
}

// startForwarderChild starts the bench binary as the forwarder for b and
// waits until it runs. Its log goes to logTo; see copyLogs.
func startForwarderChild(ctx context.Context, o options, b broker, schema string, logTo io.Writer) (*forwarderChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-case", "outage", "-postgres", o.pgURL,
		"-batch", strconv.Itoa(o.batch), "-concurrency", strconv.Itoa(o.concurrency))
	cmd.Env = append(os.Environ(),
		outageChildEnv+"="+b.pub, outageSchema+"="+schema, outageDest+"="+b.addr, outageTopic+"="+b.topic)
	// The child dies with the bench, even when the bench is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &forwarderChild{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout), logs: make(chan struct{})}
	go c.copyLogs(stderr, logTo)
	ready := make(chan error, 1)
	go func() {
		if !c.out.Scan() {
			ready <- fmt.Errorf("forwarder child exited before it was ready")
			return
		}
		if line := c.out.Text(); line != "ready" {
			ready <- fmt.Errorf("forwarder child: %q, want ready", line)
			return
		}
		ready <- nil
	}()
	select {
	case err = <-ready:
	case <-time.After(time.Minute):
		err = errors.New("forwarder child not ready after a minute")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = c.stop()
		return nil, err
	}
	return c, nil
}

// copyLogs writes the child's log to w and shows the lines about the
// breaker and the errors on stdout; failed attempts, one line each, are
// only counted (the failed column).
func (c *forwarderChild) copyLogs(stderr io.Reader, w io.Writer) {
	defer close(c.logs)
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		_, _ = fmt.Fprintln(w, line)
		switch {
		case strings.Contains(line, "destination unavailable"):
			c.opens.Add(1)
			c.openMu.Lock()
			c.openedAt = append(c.openedAt, time.Now())
			c.openMu.Unlock()
		case strings.Contains(line, "destination is back"):
			c.closes.Add(1)
		case strings.Contains(line, "publish failed; will retry"):
			continue
		}
		// Errors carry a stack trace; the first lines are enough here.
		if len(line) > 200 {
			line = line[:200] + "…"
		}
		fmt.Printf("    forwarder| %s\n", line)
	}
}

// counters asks the child for its running totals.
func (c *forwarderChild) counters() (childCounters, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := io.WriteString(c.stdin, "\n"); err != nil {
		return childCounters{}, fmt.Errorf("forwarder child: %w", err)
	}
	if !c.out.Scan() {
		return childCounters{}, errors.New("forwarder child exited")
	}
	var cc childCounters
	if _, err := fmt.Sscanf(c.out.Text()+"\n", childCountersFormat, &cc.reads, &cc.rows, &cc.errors, &cc.failed, &cc.forwarded, &cc.openReads, &cc.openRows); err != nil {
		return childCounters{}, fmt.Errorf("forwarder child said %q: %w", c.out.Text(), err)
	}
	return cc, nil
}

// stop closes the child's stdin, which makes it close its forwarder and
// exit, and waits for it; a child that has not exited after the
// forwarder's close timeout is killed.
func (c *forwarderChild) stop() error {
	c.once.Do(func() {
		_ = c.stdin.Close()
		t := time.AfterFunc(forwarder.DefaultCloseTimeout+5*time.Second, func() { _ = c.cmd.Process.Kill() })
		defer t.Stop()
		<-c.logs
		c.waited = c.cmd.Wait()
	})
	return c.waited
}

// outageChild is the forwarder process: it forwards the outbox in the
// schema outageSchema names to the destination outageDest names, counting
// what it does, until its stdin closes.
func outageChild(ctx context.Context, o options, pubName string) error {
	cfg, err := pgxpool.ParseConfig(o.pgURL)
	if err != nil {
		return err
	}
	// The parent finds the forwarder's backends by this name.
	cfg.ConnConfig.RuntimeParams["application_name"] = os.Getenv(outageSchema)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	d, err := postgres.New(postgres.Options{Schema: os.Getenv(outageSchema)})
	if err != nil {
		return err
	}
	pub, err := outagePublisher(pubName, os.Getenv(outageDest))
	if err != nil {
		return err
	}
	defer pub.Close()
	var reads, rows, errs, failed, forwarded, openReads, openRows atomic.Int64
	var open atomic.Bool
	topic := os.Getenv(outageTopic)
	f, err := forwarder.New(forwarder.Config{
		DB:          pgxv5.WrapPool(pool),
		Dialect:     d,
		Destination: pub,
		BatchSize:   o.batch,
		Concurrency: o.concurrency,
		Topic:       func(string, *message.Message) (string, error) { return topic, nil },
		// Info shows every failed attempt and the breaker closing.
		Logger: breakerWatch{watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))), &open},
		Hooks: forwarder.Hooks{
			OnRead: func(n int) {
				reads.Add(1)
				rows.Add(int64(n))
				if open.Load() {
					openReads.Add(1)
					openRows.Add(int64(n))
				}
			},
			OnError:   func(error) { errs.Add(1) },
			OnFailure: func(forwarder.FailedAttempt) { failed.Add(1) },
			OnBatch:   func(s forwarder.BatchStats) { forwarded.Add(int64(s.Forwarded)) },
		},
	})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(ctx) }()
	select {
	case <-f.Running():
	case err := <-errc:
		return fmt.Errorf("forwarder stopped: %v", err)
	}
	fmt.Println("ready")
	requests := make(chan struct{})
	go func() {
		defer close(requests)
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			requests <- struct{}{}
		}
	}()
	for {
		select {
		case _, ok := <-requests:
			if !ok {
				return errors.Join(f.Close(), <-errc)
			}
			fmt.Printf(childCountersFormat, reads.Load(), rows.Load(), errs.Load(), failed.Load(), forwarded.Load(), openReads.Load(), openRows.Load())
		case err := <-errc:
			return fmt.Errorf("forwarder stopped: %v", err)
		}
	}
}

// breakerWatch follows the forwarder's breaker through the messages it
// logs when the breaker opens and closes; the forwarder has no other
// signal for it.
type breakerWatch struct {
	watermill.LoggerAdapter
	open *atomic.Bool
}

func (w breakerWatch) Error(msg string, err error, fields watermill.LogFields) {
	if strings.Contains(msg, "destination unavailable") {
		w.open.Store(true)
	}
	w.LoggerAdapter.Error(msg, err, fields)
}

func (w breakerWatch) Info(msg string, fields watermill.LogFields) {
	if strings.Contains(msg, "destination is back") {
		w.open.Store(false)
	}
	w.LoggerAdapter.Info(msg, fields)
}

func (w breakerWatch) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return breakerWatch{w.LoggerAdapter.With(fields), w.open}
}

// outagePublisher returns the child's destination publisher.
func outagePublisher(name, addr string) (message.Publisher, error) {
	switch name {
	case "kafka":
		return testenv.NewKafkaPublisher([]string{addr}, true)
	case "kafkabatch":
		return kafkabatch.NewPublisher(kafkabatch.Config{Brokers: []string{addr}, Options: testenv.KgoProducerOptions()})
	case "amqpbatch":
		return amqpbatch.NewPublisher(amqpbatch.Config{URL: addr})
	}
	return nil, fmt.Errorf("unknown publisher %q", name)
}

// procTicks returns utime+stime+cutime+cstime of a process. The children
// terms matter for the postmaster, which collects the times of the
// backends that exit.
func procTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	_, ticks, err := parseStat(string(b))
	return ticks, err
}

// parseStat returns the command name and the CPU ticks of one
// /proc/<pid>/stat line.
func parseStat(s string) (string, uint64, error) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, fmt.Errorf("malformed stat %q", s)
	}
	// After the command: state is field 3, utime..cstime fields 14-17.
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return "", 0, fmt.Errorf("malformed stat %q", s)
	}
	var ticks uint64
	for _, v := range f[11:15] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return "", 0, fmt.Errorf("malformed stat %q: %w", s, err)
		}
		ticks += n
	}
	return s[open+1 : end], ticks, nil
}

// backends sums the CPU ticks of the Postgres backends whose
// application_name is app: the server's work for the forwarder alone. A
// backend that has exited keeps its last reading.
type backends struct {
	pool *pgxpool.Pool
	app  string
	last map[int]uint64
}

func (b *backends) ticks() (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := b.pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, b.app)
	if err != nil {
		return 0, err
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return 0, err
	}
	for _, pid := range pids {
		if t, err := procTicks(int(pid)); err == nil {
			b.last[int(pid)] = t
		}
	}
	var total uint64
	for _, t := range b.last {
		total += t
	}
	return total, nil
}

// postgresTicks sums the CPU ticks of every process named postgres.
func postgresTicks() (uint64, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		if name, ticks, err := parseStat(string(b)); err == nil && name == "postgres" {
			total += ticks
		}
	}
	return total, nil
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
