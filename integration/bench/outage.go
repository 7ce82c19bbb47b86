package main

import (
	"context"
	stdsql "database/sql"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("outage", "a broker outage under a steady load (-n msg/s, default 400; 50 keys, 256 B; -duration scales the phases): the forwarder's reads and CPU, Postgres' CPU, time to resume and to drain; -rabbit adds a RabbitMQ outage", runOutage)
}

// outageRabbit makes the outage case also stop and start the local
// RabbitMQ, which every other user of that broker notices.
var outageRabbit = flag.Bool("rabbit", false, "outage: also take the local RabbitMQ down (rabbitmqctl stop_app, then start_app); disturbs its other users")

// The forwarder of the outage case runs in a child process, the bench
// binary started again with outageChildEnv set, so that its CPU time can be
// read apart from the producer's and the in-process broker's. The child
// prints "ready" once it runs, then answers every line on its stdin with
// one line of counters; it stops when its stdin closes.
const (
	outageChildEnv = "MILLBOX_BENCH_OUTAGE_CHILD" // the publisher: kafka, kafkabatch or amqpbatch
	outageSchema   = "MILLBOX_BENCH_OUTAGE_SCHEMA"
	outageDest     = "MILLBOX_BENCH_OUTAGE_DEST" // Kafka broker address or AMQP URL
	outageTopic    = "MILLBOX_BENCH_OUTAGE_TOPIC"
)

// outageKeys is the number of ordering keys the producer cycles through;
// outageWorkers commit concurrently, each owning outageKeys/outageWorkers
// keys so that a key's messages are committed in order.
const (
	outageKeys    = 50
	outageWorkers = 10
)

// clockTicks is the unit of the CPU times in /proc/<pid>/stat (USER_HZ),
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// progressEvery is how often a phase prints a progress line.
const progressEvery = 2 * time.Second

func runOutage(ctx context.Context, o options) error {
	if mode := os.Getenv(outageChildEnv); mode != "" {
		return outageChild(ctx, o, mode)
	}
	rate := orDefault(o.n, 400)
	steady := orDefault(o.duration, 10*time.Second)
	fmt.Printf("outage: %d msg/s (%d keys, 256 B) into a Postgres outbox, one forwarder in a child process;\n", rate, outageKeys)
	fmt.Printf("phases: steady %v, broker down %v, restart and drain the backlog, steady %v; CPU in %% of one core\n", steady, 2*steady, steady/2)
	fmt.Printf("load average at start: %s\n", loadAverage())
	var results []outageResult
	for _, pub := range []string{"kafka", "kafkabatch"} {
		r, err := kafkaOutage(ctx, o, pub, rate, steady)
		if err != nil {
			return fmt.Errorf("%s: %w", pub, err)
		}
		results = append(results, r)
	}
	if *outageRabbit {
		r, err := rabbitOutage(ctx, o, rate, steady)
		if err != nil {
			return fmt.Errorf("amqpbatch: %w", err)
		}
		results = append(results, r)
	}
	fmt.Printf("load average at end: %s\n", loadAverage())
	var kv []any
	lost, outOfOrder := 0, 0
	for _, r := range results {
		p := map[string]string{"kafka": "", "kafkabatch": "batch_", "amqpbatch": "amqp_"}[r.pub]
		kv = append(kv,
			p+"outage_reads", r.phase("outage").reads,
			p+"outage_reads_breaker_open", r.phase("outage").openReads,
			p+"breaker_open_ms", int(ms(r.breakerAfter)),
			p+"forwarder_cpu_outage_pct", r.phase("outage").fwdPct,
			p+"forwarder_cpu_steady_pct", r.phase("steady").fwdPct,
			p+"pg_fwd_cpu_outage_pct", r.phase("outage").pgFwdPct,
			p+"pg_fwd_cpu_steady_pct", r.phase("steady").pgFwdPct,
			p+"pg_cpu_outage_pct", r.phase("outage").pgPct,
			p+"pg_cpu_steady_pct", r.phase("steady").pgPct,
			p+"resume_ms", int(ms(r.resume)),
			p+"drain_p90_ms", int(ms(r.drain90)),
			p+"drain_ms", int(ms(r.drain)),
		)
		lost += r.lost
		outOfOrder += r.outOfOrder
	}
	kv = append(kv, "lost", lost, "out_of_order", outOfOrder)
	summary(kv...)
	return nil
}

// broker is a destination the case takes down and brings back.
type broker struct {
	pub     string // the child's publisher: kafka, kafkabatch or amqpbatch
	addr    string // what the child dials
	topic   string
	stop    func() error
	restart func() (time.Time, error) // returns when the broker accepts connections again
	arrived *arrivals
}

// kafkaOutage runs the phases against a fresh kfake cluster that keeps its
// records on disk, so that the restarted broker still has them.
func kafkaOutage(ctx context.Context, o options, pub string, rate int, steady time.Duration) (outageResult, error) {
	dir, err := os.MkdirTemp("", "millbox-outage-")
	if err != nil {
		return outageResult{}, err
	}
	defer os.RemoveAll(dir)
	k, err := testenv.NewKafka(testenv.KafkaConfig{DataDir: filepath.Join(dir, "kfake")})
	if err != nil {
		return outageResult{}, err
	}
	defer k.Stop()
	topic := fmt.Sprintf("outage-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return outageResult{}, err
	}
	defer col.Close()
	b := broker{
		pub: pub, addr: k.Addr(), topic: topic,
		stop: func() error { k.Stop(); return nil },
		restart: func() (time.Time, error) {
			err := k.Restart()
			return time.Now(), err
		},
		arrived: &arrivals{cols: []*testenv.Collection{col.Collection}},
	}
	return outage(ctx, o, b, rate, steady)
}

// rabbitOutage runs the phases against the local RabbitMQ with the
// amqpbatch publisher. The consumer cannot follow the node through
// stop_app, so a second one takes over after start_app; RabbitMQ is
// started again whatever happens.
func rabbitOutage(ctx context.Context, o options, rate int, steady time.Duration) (outageResult, error) {
	queue := fmt.Sprintf("millbox_outage_%d", time.Now().UnixNano())
	col, err := testenv.NewAMQPCollector(o.amqpURL, queue)
	if err != nil {
		return outageResult{}, fmt.Errorf("rabbitmq at %s: %w", o.amqpURL, err)
	}
	cols := []*testenv.AMQPCollector{col}
	stopped := false
	defer func() {
		if stopped {
			if err := testenv.StartRabbitMQ(); err != nil {
				fmt.Fprintf(os.Stderr, "start RabbitMQ again: %v\n", err)
			}
		}
		for _, c := range cols {
			c.Close()
		}
		_ = testenv.DeleteAMQPQueues(o.amqpURL, queue)
	}()
	arrived := &arrivals{cols: []*testenv.Collection{col.Collection}}
	b := broker{
		pub: "amqpbatch", addr: o.amqpURL, topic: queue,
		stop: func() error {
			stopped = true
			if out, err := exec.Command("rabbitmqctl", "stop_app").CombinedOutput(); err != nil {
				return fmt.Errorf("rabbitmqctl stop_app: %w: %s", err, out)
			}
			return nil
		},
		restart: func() (time.Time, error) {
			if err := testenv.StartRabbitMQ(); err != nil {
				return time.Time{}, err
			}
			stopped = false
			up := time.Now()
			// Deliveries waiting in the queue meanwhile arrive when this
			// consumer starts: a few milliseconds late.
			c, err := testenv.NewAMQPCollector(o.amqpURL, queue)
			if err != nil {
				return time.Time{}, err
			}
			cols = append(cols, c)
			arrived.add(c.Collection)
			return up, nil
		},
		arrived: arrived,
	}
	return outage(ctx, o, b, rate, steady)
}

// phaseStats is what one phase cost.
type phaseStats struct {
	name           string
	dur            time.Duration
	produced       int
	reads, rows    int64
	openReads      int64
	errors, failed int64
	opens, closes  int64
	fwdPct, pgPct  float64
	pgFwdPct       float64
}

// outageResult is one run of the phases.
type outageResult struct {
	pub                          string
	phases                       []phaseStats  // steady, stop, outage, start, drain, after
	breakerAfter                 time.Duration // from the stop to the breaker's first opening
	resume, drain90, drain       time.Duration
	backlog                      int
	lost, outOfOrder, duplicates int
}

// phase returns the stats of the phase called name.
func (r outageResult) phase(name string) phaseStats {
	for _, p := range r.phases {
		if p.name == name {
			return p
		}
	}
	return phaseStats{}
}

// outage runs steady, broker down, restart and drain, and steady again,
// with one forwarder in a child process publishing to b. The stop and
// start phases are the time the broker takes to go down and come back:
// nothing with kfake, seconds with RabbitMQ.
func outage(ctx context.Context, o options, b broker, rate int, steady time.Duration) (outageResult, error) {
	res := outageResult{pub: b.pub}
	// pgOutbox, keeping the schema's name for the child.
	pool, schema, err := benchPostgres(ctx, o.pgURL)
	if err != nil {
		return res, err
	}
	defer dropSchema(pool, schema)
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err == nil {
		err = sqladapters.Migrate(ctx, pgxv5.WrapPool(pool), d)
	}
	if err != nil {
		return res, err
	}
	logFile, err := os.CreateTemp("", "millbox-outage-"+b.pub+"-*.log")
	if err != nil {
		return res, err
	}
	defer logFile.Close()
	child, err := startForwarderChild(ctx, o, b, schema, logFile)
	if err != nil {
		return res, err
	}
	defer child.stop()
	fmt.Printf("\n%s publisher, forwarder pid %d, its log in %s\n", b.pub, child.cmd.Process.Pid, logFile.Name())

	prod := startProducer(pgxv5.WrapPool(pool), d, rate)
	defer prod.halt()
	m := &meter{child: child, prod: prod, arrived: b.arrived, backends: &backends{pool: pool, app: schema, last: map[int]uint64{}}}
	s0, err := m.sample()
	if err != nil {
		return res, err
	}
	s1, err := m.phase(ctx, "steady", s0, steady, nil)
	if err != nil {
		return res, err
	}
	stopAt := time.Now()
	if err := b.stop(); err != nil {
		return res, err
	}
	fmt.Printf("  broker stopped (in %v)\n", time.Since(stopAt).Round(time.Millisecond))
	down, err := m.sample()
	if err != nil {
		return res, err
	}
	s2, err := m.phase(ctx, "outage", down, 2*steady, nil)
	if err != nil {
		return res, err
	}
	startAt := time.Now()
	restartAt, err := b.restart()
	if err != nil {
		return res, err
	}
	fmt.Printf("  broker restarted (in %v, %v after the stop)\n",
		restartAt.Sub(startAt).Round(time.Millisecond), restartAt.Sub(stopAt).Round(time.Millisecond))
	up, err := m.sample()
	if err != nil {
		return res, err
	}
	backlog := b.arrived.missing(prod.committedBefore(restartAt))
	res.backlog = len(backlog)
	drained := make(chan struct{})
	var drainErr error
	go func() {
		defer close(drained)
		drainErr = b.arrived.waitUUIDs(ctx, backlog, 5*time.Minute)
	}()
	s3, err := m.phase(ctx, "drain", up, 0, drained)
	if err != nil {
		return res, err
	}
	if drainErr != nil {
		return res, fmt.Errorf("backlog not drained: %w", drainErr)
	}
	s4, err := m.phase(ctx, "after", s3, steady/2, nil)
	if err != nil {
		return res, err
	}
	prod.halt()
	if err := prod.err(); err != nil {
		return res, fmt.Errorf("producer: %w", err)
	}
	res.phases = []phaseStats{
		diff("steady", s0, s1), diff("stop", s1, down), diff("outage", down, s2),
		diff("start", s2, up), diff("drain", up, s3), diff("after", s3, s4),
	}

	sent := prod.committedBefore(time.Now())
	if err := b.arrived.waitUUIDs(ctx, sent, 2*time.Minute); err != nil {
		fmt.Printf("  not everything arrived: %v\n", err)
	}
	res.resume, res.drain90, res.drain = b.arrived.resumeAfter(restartAt, backlog)
	if at := child.openedAfter(stopAt); !at.IsZero() {
		res.breakerAfter = at.Sub(stopAt)
	}
	res.lost, res.outOfOrder, res.duplicates = b.arrived.check(sent)
	if err := child.stop(); err != nil {
		return res, fmt.Errorf("forwarder child: %w", err)
	}

	// open_reads: reads while the breaker was open; errors: Hooks.OnError;
	// failed: failed attempts; opens/closes: the breaker's; pg_fwd: the
	// backends serving the forwarder; pg: the whole server.
	fmt.Printf("  %-7s %6s %8s %6s %8s %10s %6s %6s %5s %6s %8s %11s %7s\n",
		"phase", "secs", "produced", "reads", "rows", "open_reads", "errors", "failed", "opens", "closes", "fwd_cpu%", "pg_fwd_cpu%", "pg_cpu%")
	for _, p := range res.phases {
		if (p.name == "stop" || p.name == "start") && p.dur < time.Second {
			continue // an instant, as with kfake: no rate to speak of
		}
		fmt.Printf("  %-7s %6.1f %8d %6d %8d %10d %6d %6d %5d %6d %8.1f %11.1f %7.1f\n",
			p.name, p.dur.Seconds(), p.produced, p.reads, p.rows, p.openReads, p.errors, p.failed, p.opens, p.closes, p.fwdPct, p.pgFwdPct, p.pgPct)
	}
	if res.breakerAfter > 0 {
		fmt.Printf("  breaker first opened %.0f ms after the stop\n", ms(res.breakerAfter))
	}
	fmt.Printf("  restart -> first delivery %.0f ms; backlog (the %d messages committed but not delivered at the restart) 90%% in %.0f ms, all in %.0f ms\n",
		ms(res.resume), res.backlog, ms(res.drain90), ms(res.drain))
	fmt.Printf("  %d messages, lost %d, out of order %d, duplicates %d\n", len(sent), res.lost, res.outOfOrder, res.duplicates)
	return res, nil
}

// sample is the state of a run at one moment.
type sample struct {
	at       time.Time
	fwd, pg  uint64 // CPU ticks of the forwarder child and of all postgres processes
	pgFwd    uint64 // CPU ticks of the backends serving the forwarder
	c        childCounters
	opens    int64 // breaker openings and closings so far
	closes   int64
	produced int
	arrived  int
}

// diff describes the phase between two samples.
func diff(name string, a, b sample) phaseStats {
	dur := b.at.Sub(a.at)
	pct := func(ticks uint64) float64 {
		return float64(ticks) / clockTicks / dur.Seconds() * 100
	}
	return phaseStats{
		name: name, dur: dur, produced: b.produced - a.produced,
		reads: b.c.reads - a.c.reads, rows: b.c.rows - a.c.rows, openReads: b.c.openReads - a.c.openReads,
		errors: b.c.errors - a.c.errors, failed: b.c.failed - a.c.failed,
		opens: b.opens - a.opens, closes: b.closes - a.closes,
		fwdPct: pct(b.fwd - a.fwd), pgPct: pct(b.pg - a.pg), pgFwdPct: pct(b.pgFwd - a.pgFwd),
	}
}

// meter samples a run.
type meter struct {
	child    *forwarderChild
	prod     *producer
	arrived  *arrivals
	backends *backends
}

func (m *meter) sample() (sample, error) {
	c, err := m.child.counters()
	if err != nil {
		return sample{}, err
	}
	fwd, err := procTicks(m.child.cmd.Process.Pid)
	if err != nil {
		return sample{}, err
	}
	// Every postgres process of the server, so this is the whole server's
	// work: other databases' load on a shared machine shows up here too.
	pg, err := postgresTicks()
	if err != nil {
		return sample{}, err
	}
	pgFwd, err := m.backends.ticks()
	if err != nil {
		return sample{}, err
	}
	return sample{
		at: time.Now(), fwd: fwd, pg: pg, pgFwd: pgFwd, c: c,
		opens: m.child.opens.Load(), closes: m.child.closes.Load(),
		produced: m.prod.count(), arrived: m.arrived.distinct(),
	}, nil
}

// phase prints a progress line every progressEvery until d has passed
// (d > 0) or done is closed, and returns the closing sample.
func (m *meter) phase(ctx context.Context, name string, start sample, d time.Duration, done <-chan struct{}) (sample, error) {
	var deadline <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d - time.Since(start.at))
		defer t.Stop()
		deadline = t.C
	}
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	prev := start
	for {
		select {
		case <-ctx.Done():
			return sample{}, ctx.Err()
		case <-deadline:
			return m.sample()
		case <-done:
			return m.sample()
		case <-tick.C:
			s, err := m.sample()
			if err != nil {
				return sample{}, err
			}
			p := diff(name, prev, s)
			fmt.Printf("  %-7s %5.1fs  produced %6d  arrived %6d  reads %5d  rows %6d  fwd_cpu %5.1f%%  pg_fwd_cpu %5.1f%%  pg_cpu %5.1f%%\n",
				name, s.at.Sub(start.at).Seconds(), s.produced, s.arrived, s.c.reads, s.c.rows, p.fwdPct, p.pgFwdPct, p.pgPct)
			prev = s
		}
	}
}

// producer commits one message per transaction at a steady rate until
// halted, and remembers when each was committed.
type producer struct {
	halting chan struct{}
	once    sync.Once
	wg      sync.WaitGroup

	mu        sync.Mutex
	committed []committedMsg
	firstErr  error
}

type committedMsg struct {
	uuid string
	at   time.Time
}

// startProducer starts outageWorkers goroutines; message i has key
// i%outageKeys and metadata seq i/outageKeys, and worker i%outageWorkers
// commits it, so each key's messages come from one worker in order.
func startProducer(db sqladapters.DB, d sqladapters.Dialect, rate int) *producer {
	p := &producer{halting: make(chan struct{})}
	body := make([]byte, 256)
	for i := range body {
		body[i] = byte('a' + i%26)
	}
	start := time.Now()
	for w := range outageWorkers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			timer := time.NewTimer(0)
			defer timer.Stop()
			for i := w; ; i += outageWorkers {
				timer.Reset(time.Until(start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))))
				select {
				case <-p.halting:
					return
				case <-timer.C:
				}
				m := message.NewMessage(watermill.NewUUID(), body)
				m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%outageKeys))
				m.Metadata.Set("seq", strconv.Itoa(i/outageKeys))
				err := commitOne(db, d, m)
				p.mu.Lock()
				if err != nil && p.firstErr == nil {
					p.firstErr = err
				}
				if err == nil {
					p.committed = append(p.committed, committedMsg{uuid: m.UUID, at: time.Now()})
				}
				p.mu.Unlock()
			}
		}()
	}
	return p
}

// commitOne writes m into the outbox in a transaction of its own. It does
// not take the run's context: an interrupt stops the producer between
// messages, never in the middle of a commit.
func commitOne(db sqladapters.DB, d sqladapters.Dialect, m *message.Message) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := db.Begin(ctx, stdsql.TxOptions{})
	if err != nil {
		return err
	}
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err == nil {
		err = pub.Publish("outage", m)
	}
	if err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return tx.Commit(ctx)
}

// halt stops the producer and waits for the commits in progress.
func (p *producer) halt() {
	p.once.Do(func() { close(p.halting) })
	p.wg.Wait()
}

func (p *producer) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firstErr
}

func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.committed)
}

// committedBefore returns the UUIDs of the messages committed before t.
func (p *producer) committedBefore(t time.Time) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, c := range p.committed {
		if c.at.Before(t) {
			out = append(out, c.uuid)
		}
	}
	return out
}

// arrivals is what the consumers of the destination saw, in one
// collection per consumer connection.
type arrivals struct {
	mu   sync.Mutex
	cols []*testenv.Collection
}

func (a *arrivals) add(c *testenv.Collection) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cols = append(a.cols, c)
}

func (a *arrivals) collections() []*testenv.Collection {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*testenv.Collection(nil), a.cols...)
}

func (a *arrivals) distinct() int {
	n := 0
	for _, c := range a.collections() {
		n += c.Distinct()
	}
	return n
}

// waitUUIDs waits until every uuid has arrived at some consumer.
func (a *arrivals) waitUUIDs(ctx context.Context, uuids []string, timeout time.Duration) error {
	cols := a.collections()
	last := cols[len(cols)-1]
	var rest []string
	for _, u := range uuids {
		if _, ok := a.get(cols[:len(cols)-1], u); !ok {
			rest = append(rest, u)
		}
	}
	return last.WaitUUIDs(ctx, rest, timeout)
}

// missing returns the uuids that have not arrived.
func (a *arrivals) missing(uuids []string) []string {
	cols := a.collections()
	var out []string
	for _, u := range uuids {
		if _, ok := a.get(cols, u); !ok {
			out = append(out, u)
		}
	}
	return out
}

func (a *arrivals) get(cols []*testenv.Collection, uuid string) (testenv.Record, bool) {
	for _, c := range cols {
		if r, ok := c.Get(uuid); ok {
			return r, true
		}
	}
	return testenv.Record{}, false
}

// resumeAfter returns the time from restart to the first delivery after
// it, and to the arrival of 90% and of all of the backlog.
func (a *arrivals) resumeAfter(restart time.Time, backlog []string) (first, p90, drained time.Duration) {
	cols := a.collections()
	var firstAt time.Time
	for _, c := range cols {
		for _, r := range c.Records() {
			if r.Arrived.After(restart) && (firstAt.IsZero() || r.Arrived.Before(firstAt)) {
				firstAt = r.Arrived
			}
		}
	}
	var after []time.Duration
	for _, u := range backlog {
		if r, ok := a.get(cols, u); ok {
			after = append(after, max(r.Arrived.Sub(restart), 0))
		}
	}
	if len(after) == 0 {
		return max(firstAt.Sub(restart), 0), 0, 0
	}
	slices.Sort(after)
	return max(firstAt.Sub(restart), 0), after[(len(after)-1)*9/10], after[len(after)-1]
}

// check counts the sent messages that never arrived, the first deliveries
// of a key whose seq is not above the key's previous one, and the
// deliveries beyond the first.
func (a *arrivals) check(sent []string) (lost, outOfOrder, duplicates int) {
	cols := a.collections()
	for _, u := range sent {
		if _, ok := a.get(cols, u); !ok {
			lost++
		}
	}
	seen := map[string]bool{}
	last := map[string]int{}
	for _, c := range cols {
		duplicates += c.Len() - c.Distinct()
		for _, r := range c.FirstDeliveries() {
			if seen[r.UUID] {
				duplicates++
				continue
			}
			seen[r.UUID] = true
			seq, err := strconv.Atoi(r.Metadata["seq"])
			if err != nil {
				outOfOrder++
				continue
			}
			if prev, ok := last[r.Key]; ok && seq <= prev {
				outOfOrder++
			}
			last[r.Key] = max(seq, last[r.Key])
		}
	}
	return lost, outOfOrder, duplicates
}
