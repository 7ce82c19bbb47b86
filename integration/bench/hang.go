package main

import (
	"context"
	stdsql "database/sql"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

func init() {
	register("hang", "one key's Kafka call hangs for -duration (default 20s) while 50 other keys flow at 200 msg/s: their commit-to-arrival p50/p99 before and during the hang, polling and CDC (Postgres to kfake, watermill-kafka)", runHang)
}

// hangPublisher holds a call that carries a message of key until the time
// in until (none while it is nil), then publishes it.
type hangPublisher struct {
	message.Publisher
	key   string
	until atomic.Pointer[time.Time]
}

func (p *hangPublisher) Publish(topic string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get(forwarder.DefaultKeyMetadataField) != p.key {
			continue
		}
		if t := p.until.Load(); t != nil {
			time.Sleep(time.Until(*t))
		}
		break
	}
	return p.Publisher.Publish(topic, msgs...)
}

// runHang measures whether independent keys keep their latency while
// another key's call hangs. For each source, on a fresh outbox, it commits
// 200 messages a second over 50 keys for 10 s, then commits one message
// of a key whose call then hangs for -duration while the 50 keys go on
// at the same rate for as long, and prints the p50 and p99 of the 50
// keys' commit-to-arrival times before and during the hang.
func runHang(ctx context.Context, o options) error {
	hang := orDefault(o.duration, 20*time.Second)
	const rate, keys, before = 200, 50, 10 * time.Second
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return err
	}
	defer k.Stop()
	fmt.Printf("%d msg/s over %d keys, Postgres to Kafka (kfake, watermill-kafka), default settings: %v before, then one more key's call hangs for %v; load average %s\n",
		rate, keys, before, hang, loadAverage())
	var kv []any
	for _, useCDC := range []bool{false, true} {
		name := map[bool]string{false: "poll", true: "cdc"}[useCDC]
		b50, b99, d50, d99, err := hangRun(ctx, o, k, useCDC, rate, keys, before, hang)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fmt.Printf("%-4s other keys before the hang: p50 %6.1f ms  p99 %6.1f ms; during: p50 %6.1f ms  p99 %6.1f ms (p99 %.2fx)\n",
			name, ms(b50), ms(b99), ms(d50), ms(d99), float64(d99)/float64(b99))
		kv = append(kv, name+"_before_p50_ms", ms(b50), name+"_before_p99_ms", ms(b99),
			name+"_hang_p50_ms", ms(d50), name+"_hang_p99_ms", ms(d99), name+"_p99_hang_vs_before", float64(d99)/float64(b99))
	}
	summary(kv...)
	return nil
}

func hangRun(ctx context.Context, o options, k *testenv.Kafka, useCDC bool, rate, keys int, before, hang time.Duration) (b50, b99, d50, d99 time.Duration, err error) {
	pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer cleanup()
	db := pgxv5.WrapPool(pool)
	topic := fmt.Sprintf("hang-%d", time.Now().UnixNano())
	col, err := testenv.NewKafkaCollector(k.Addrs(), topic)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer col.Close()
	kp, err := testenv.NewKafkaPublisher(k.Addrs(), true)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer kp.Close()
	pub := &hangPublisher{Publisher: kp, key: "hung"}
	stop, err := benchForwarder(ctx, o, db, d, pub, topic, useCDC)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	defer func() {
		if serr := stop(); err == nil {
			err = serr
		}
	}()
	commit := func(key string) (string, error) {
		tx, err := db.Begin(ctx, stdsql.TxOptions{})
		if err != nil {
			return "", err
		}
		p, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
		if err != nil {
			sqladapters.Rollback(tx)
			return "", err
		}
		m := message.NewMessage(watermill.NewUUID(), make([]byte, 256))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, key)
		if err := p.Publish(topic, m); err != nil {
			sqladapters.Rollback(tx)
			return "", err
		}
		return m.UUID, tx.Commit(ctx)
	}
	other := func(i int) (string, error) { return commit("key-" + strconv.Itoa(i%keys)) }
	calm, err := produceAtRate(ctx, rate, before, other)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	until := time.Now().Add(hang)
	pub.until.Store(&until)
	if _, err := commit("hung"); err != nil {
		return 0, 0, 0, 0, err
	}
	hung, err := produceAtRate(ctx, rate, hang, other)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	if b50, b99, err = latencies(ctx, col.Collection, calm); err != nil {
		return 0, 0, 0, 0, err
	}
	if d50, d99, err = latencies(ctx, col.Collection, hung); err != nil {
		return 0, 0, 0, 0, err
	}
	return b50, b99, d50, d99, nil
}
