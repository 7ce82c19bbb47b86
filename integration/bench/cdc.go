package main

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/cdc"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func init() {
	register("cdc", "change data capture vs polling forwarder, and CDC of the outbox without a table, Postgres to Kafka (kfake, kafkabatch): drain of a burst of N messages, and commit-to-arrival latency at 1,000 msg/s", runCDC)
}

// Forwarding modes of the cdc case: polling the table, streaming the
// table's inserts, streaming the messages of publishers without a table.
const (
	modePoll = iota
	modeCDC
	modeEmit
)

var modeNames = map[int]string{modePoll: "poll", modeCDC: "cdc", modeEmit: "emit"}

// benchForwarder starts the CDC (cdc true) or the polling forwarder on a
// fresh outbox, sending every row to topic, and returns its stop.
func benchForwarder(ctx context.Context, o options, db sqladapters.DB, d *postgres.Dialect, pub message.Publisher, topic string, useCDC bool) (func() error, error) {
	toTopic := func(string, *message.Message) (string, error) { return topic, nil }
	if !useCDC {
		f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, Topic: toTopic, BatchSize: o.batch, Concurrency: o.concurrency})
		if err != nil {
			return nil, err
		}
		errc := make(chan error, 1)
		go func() { errc <- f.Run(ctx) }()
		if err := f.Ready(ctx); err != nil {
			return nil, err
		}
		return func() error { _ = f.Close(); return <-errc }, nil
	}
	slot := fmt.Sprintf("mbbench_%d", time.Now().UnixNano())
	src := cdc.Source{ConnString: o.pgURL, Slot: slot, Publication: slot}
	if err := cdc.Setup(ctx, db, d, src); err != nil {
		return nil, err
	}
	drop := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		for ctx.Err() == nil {
			if err = cdc.Drop(ctx, db, d, src); err == nil {
				return nil
			}
			time.Sleep(100 * time.Millisecond) // the slot is released a moment after the reader stops
		}
		return err
	}
	f, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, Topic: toTopic, Concurrency: o.concurrency, Source: src})
	if err != nil {
		_ = drop()
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- f.Run(ctx) }()
	if err := f.Ready(ctx); err != nil {
		_ = drop()
		return nil, err
	}
	for len(f.Partitions()) == 0 && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
	return func() error {
		_ = f.Close()
		err := <-errc
		if derr := drop(); err == nil {
			err = derr
		}
		return err
	}, nil
}

// gatedPublisher holds every Publish call until open is closed.
type gatedPublisher struct {
	message.Publisher
	open chan struct{}
}

func (p *gatedPublisher) Publish(topic string, msgs ...*message.Message) error {
	<-p.open
	return p.Publisher.Publish(topic, msgs...)
}

// cdcDrain starts a forwarder whose publisher is held, commits n messages
// (200 keys, 256 B, 5,000 per transaction), then lets the publisher go
// and returns the rate from then to the arrival of the last message: how
// fast the forwarder drains a burst it has seen committed.
func cdcDrain(ctx context.Context, o options, k *testenv.Kafka, n int, mode int) (float64, error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	topic := fmt.Sprintf("cdc-drain-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return 0, err
	}
	defer col.Close()
	kp, err := kafkaPublisher(k, true)
	if err != nil {
		return 0, err
	}
	defer kp.Close()
	pub := &gatedPublisher{Publisher: kp, open: make(chan struct{})}
	stop, err := benchForwarder(ctx, o, db, d, pub, topic, mode != modePoll)
	if err != nil {
		close(pub.open)
		return 0, err
	}
	if err := prefillWith(ctx, db, d, n, 200, 256, mode == modeEmit); err != nil {
		close(pub.open)
		_ = stop()
		return 0, err
	}
	start := time.Now()
	close(pub.open)
	werr := col.WaitN(ctx, n, 10*time.Minute)
	elapsed := col.LastFirstArrival().Sub(start)
	if err := stop(); werr == nil {
		werr = err
	}
	if werr != nil {
		return 0, werr
	}
	fmt.Printf("  drained in %v (%d duplicates)\n", elapsed.Round(time.Millisecond), col.Duplicates())
	return float64(n) / elapsed.Seconds(), nil
}

// cdcLatency commits rate messages per second for dur while a forwarder
// runs and returns the p50 and p99 of commit-to-arrival times.
func cdcLatency(ctx context.Context, o options, k *testenv.Kafka, rate int, dur time.Duration, mode int) (p50, p99 time.Duration, walMBps float64, err error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, 0, 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	topic := fmt.Sprintf("cdc-latency-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return 0, 0, 0, err
	}
	defer col.Close()
	pub, err := kafkaPublisher(k, true)
	if err != nil {
		return 0, 0, 0, err
	}
	defer pub.Close()
	stop, err := benchForwarder(ctx, o, db, d, pub, topic, mode != modePoll)
	if err != nil {
		return 0, 0, 0, err
	}
	// Logical decoding reads the WAL of the whole cluster: measure it.
	var walStart, walEnd int64
	_ = pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&walStart)
	began := time.Now()
	committed, err := produceAtRate(ctx, rate, dur, func(i int) (string, error) {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return "", err
		}
		p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d, WithoutTable: mode == modeEmit, Slot: "*"})
		if err != nil {
			return "", err
		}
		m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, "key-"+strconv.Itoa(i%200))
		if err := p.Publish(topic, m); err != nil {
			sqladapters.Rollback(tx)
			return "", err
		}
		return m.UUID, tx.Commit(ctx)
	})
	_ = pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint`).Scan(&walEnd)
	walMBps = float64(walEnd-walStart) / (1 << 20) / time.Since(began).Seconds()
	if err == nil {
		p50, p99, err = latencies(ctx, col.Collection, committed)
	}
	if serr := stop(); err == nil {
		err = serr
	}
	return p50, p99, walMBps, err
}

func runCDC(ctx context.Context, o options) error {
	n := orDefault(o.n, 100000)
	dur := orDefault(o.duration, 10*time.Second)
	const rate = 1000
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Printf("drain: %d messages (200 keys, 256 B, 5,000 per transaction) committed while the forwarder's publisher is held, then released; to Kafka (kfake) with kafkabatch\n", n)
	fmt.Printf("cdc: the table's inserts streamed; emit: publishers without a table, their messages streamed; poll: the table polled\n")
	drain := map[int]float64{}
	for _, mode := range []int{modeCDC, modeEmit, modePoll} {
		r, err := cdcDrain(ctx, o, k, n, mode)
		if err != nil {
			return fmt.Errorf("%s drain: %w", modeNames[mode], err)
		}
		drain[mode] = r
		fmt.Printf("%-5s %8.0f msg/s\n", modeNames[mode]+":", r)
	}
	fmt.Printf("latency: %d msg/s, one message per transaction, for %v, commit -> arrival at a Kafka consumer\n", rate, dur)
	p50, p99 := map[int]time.Duration{}, map[int]time.Duration{}
	var wal float64
	for _, mode := range []int{modeCDC, modeEmit, modePoll} {
		a, b, w, err := cdcLatency(ctx, o, k, rate, dur, mode)
		if err != nil {
			return fmt.Errorf("%s latency: %w", modeNames[mode], err)
		}
		p50[mode], p99[mode] = a, b
		if mode == modeCDC {
			wal = w
			fmt.Printf("cdc:  p50 %v p99 %v (the cluster wrote %.1f MB/s of WAL meanwhile, all of it read by the decoder)\n", a, b, w)
		} else {
			fmt.Printf("%-5s p50 %v p99 %v (WAL %.1f MB/s)\n", modeNames[mode]+":", a, b, w)
		}
	}
	summary("cdc_msgs_per_s", drain[modeCDC], "emit_cdc_msgs_per_s", drain[modeEmit], "poll_msgs_per_s", drain[modePoll],
		"cdc_vs_poll", drain[modeCDC]/drain[modePoll], "emit_vs_table_cdc", drain[modeEmit]/drain[modeCDC],
		"cdc_p50_ms", ms(p50[modeCDC]), "cdc_p99_ms", ms(p99[modeCDC]), "emit_p50_ms", ms(p50[modeEmit]), "emit_p99_ms", ms(p99[modeEmit]),
		"poll_p50_ms", ms(p50[modePoll]), "poll_p99_ms", ms(p99[modePoll]), "cluster_wal_mb_per_s", wal)
	return nil
}
