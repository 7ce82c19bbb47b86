package main

import (
	"bufio"
	"context"
	stdsql "database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("pgbouncer", "commit-to-Kafka latency with the producer in another process, straight to Postgres vs through PgBouncer in transaction pooling (MILLBOX_PGBOUNCER_URL), without and with Notify (listener on a direct connection); -n msg/s, default 200", runPgBouncer)
}

// The producer runs as a child process of the bench (this case again, with
// pgbProducerEnv set): it commits at the rate asked and prints each
// message's UUID and commit time.
const (
	pgbProducerEnv = "MILLBOX_BENCH_PGB_PRODUCER" // url,schema,notify,topic,rate,duration
	pgbKeys        = 50
)

func runPgBouncer(ctx context.Context, o options) error {
	if spec := os.Getenv(pgbProducerEnv); spec != "" {
		return pgbProducer(ctx, spec)
	}
	rate := orDefault(o.n, 200)
	dur := orDefault(o.duration, 10*time.Second)
	bouncer := testenv.PgBouncerURL()
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Printf("%d msg/s for %v (%d keys, 256 B) committed by another process; commit -> arrival at a Kafka consumer\n", rate, dur, pgbKeys)
	fmt.Printf("PgBouncer: %s\n\n", bouncer)
	var kv []any
	for _, run := range []struct {
		via, url, mode string
	}{
		{"direct", o.pgURL, "watch"}, {"direct", o.pgURL, "notify"},
		{"pgbouncer", bouncer, "watch"}, {"pgbouncer", bouncer, "notify"},
		// Notify with the listener on the PgBouncer pool: notifications
		// are lost, the forwarder says so and watches instead.
		{"pgbouncer", bouncer, "notify-pooled-listener"},
	} {
		p50, p99, err := pgbLatency(ctx, o.pgURL, run.url, run.mode, k, rate, dur)
		if err != nil {
			return fmt.Errorf("%s, %s: %w", run.via, run.mode, err)
		}
		fmt.Printf("%-10s %-23s p50 %6.1f ms  p99 %6.1f ms\n", run.via, run.mode, ms(p50), ms(p99))
		name := run.via + "_" + strings.ReplaceAll(run.mode, "-", "_")
		kv = append(kv, name+"_p50_ms", ms(p50), name+"_p99_ms", ms(p99))
	}
	summary(kv...)
	return nil
}

// pgbLatency runs a forwarder whose pool goes to url (the producer's too).
// Mode "watch" is the default; "notify" turns Options.Notify on, with the
// listener on a direct connection to direct; "notify-pooled-listener"
// leaves the listener on the pool, where it is expected to lose
// notifications.
func pgbLatency(ctx context.Context, direct, url, mode string, k *testenv.Kafka, rate int, dur time.Duration) (p50, p99 time.Duration, err error) {
	notify := mode != "watch"
	_, plain, cleanup, err := pgOutbox(ctx, direct)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	d, err := postgres.New(postgres.Options{Schema: plain.Schema(), Notify: notify})
	if err != nil {
		return 0, 0, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	topic := fmt.Sprintf("pgbouncer-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return 0, 0, err
	}
	defer col.Close()
	pub, err := testenv.NewKafkaPublisher(k.Addrs(), true)
	if err != nil {
		return 0, 0, err
	}
	defer pub.Close()
	db := pgxv5.WrapPool(pool, pgxv5.ListenOn(direct))
	if mode == "notify-pooled-listener" {
		db = pgxv5.WrapPool(pool)
	}
	var lost atomic.Int64
	f, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     d,
		Destination: pub,
		Logger:      watermill.NopLogger{},
		Hooks: forwarder.Hooks{OnError: func(err error) {
			if errors.Is(err, forwarder.ErrNotificationsLost) {
				lost.Add(1)
			}
		}},
	})
	if err != nil {
		return 0, 0, err
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(ctx) }()
	defer func() {
		_ = f.Close()
		if rerr := <-errc; err == nil {
			err = rerr
		}
	}()
	if err := f.Ready(ctx); err != nil {
		return 0, 0, err
	}
	committed, err := pgbProduce(ctx, url, d, topic, rate, dur)
	if err != nil {
		return 0, 0, err
	}
	if n := lost.Load(); (n > 0) != (mode == "notify-pooled-listener") {
		return 0, 0, fmt.Errorf("the forwarder reported lost notifications %d times", n)
	}
	return latencies(ctx, col.Collection, committed)
}

// pgbProduce runs the producer process and reads what it committed when.
func pgbProduce(ctx context.Context, url string, d *postgres.Dialect, topic string, rate int, dur time.Duration) (map[string]time.Time, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "-case", "pgbouncer")
	cmd.Env = append(os.Environ(), pgbProducerEnv+"="+strings.Join([]string{
		url, d.Schema(), strconv.FormatBool(d.NotifyChannel() != ""), topic, strconv.Itoa(rate), dur.String()}, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	committed := map[string]time.Time{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		uuid, at, ok := strings.Cut(sc.Text(), " ")
		if n, err := strconv.ParseInt(at, 10, 64); ok && err == nil {
			committed[uuid] = time.Unix(0, n)
		}
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("producer process: %w", err)
	}
	if len(committed) == 0 {
		return nil, errors.New("the producer process committed nothing")
	}
	return committed, nil
}

// pgbProducer is the producer process: it commits one message per
// transaction at the rate asked, then prints "UUID commit-unix-nanos"
// lines.
func pgbProducer(ctx context.Context, spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 6 {
		return fmt.Errorf("%s=%q: want url,schema,notify,topic,rate,duration", pgbProducerEnv, spec)
	}
	url, schema, topic := f[0], f[1], f[3]
	notify, _ := strconv.ParseBool(f[2])
	rate, _ := strconv.Atoi(f[4])
	dur, err := time.ParseDuration(f[5])
	if err != nil {
		return err
	}
	d, err := postgres.New(postgres.Options{Schema: schema, Notify: notify})
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	db := pgxv5.WrapPool(pool)
	committed, err := produceAtRate(ctx, rate, dur, func(i int) (string, error) {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return "", err
		}
		p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			return "", err
		}
		m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%pgbKeys))
		if err := p.Publish(topic, m); err != nil {
			sqladapters.Rollback(tx)
			return "", err
		}
		return m.UUID, tx.Commit(ctx)
	})
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	for uuid, at := range committed {
		fmt.Fprintf(w, "%s %d\n", uuid, at.UnixNano())
	}
	return w.Flush()
}
