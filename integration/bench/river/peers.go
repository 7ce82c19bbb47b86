package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
)

// The peers case runs River and millbox as their users run them, on the
// same database and the same Kafka cluster, with the same events:
//
//   - write: the business transaction (one order row) with River's InsertTx
//     of one job, or with millbox's PublishTx of one message;
//   - forward: a prefilled backlog drained into Kafka by River workers whose
//     Work publishes the job's event, or by the millbox forwarder, both with
//     the watermill-kafka publisher keyed by the event's ordering key, timed
//     until every message was read back from Kafka;
//   - order: each topic read back in partition order, counting per key the
//     messages that came after a later one.

// seqField is the metadata field that numbers an event within its key, in
// the order the events were committed.
const seqField = "seq"

// outboxTopic is the topic the events are written for; each drain sends
// them to a Kafka topic of its own.
const outboxTopic = "orders"

// peerEvent is one event as both sides carry it: River as a job's args,
// millbox as a message. Both publish it to Kafka as the same message.
type peerEvent struct {
	UUID    string `json:"uuid"`
	Key     string `json:"key"`
	Seq     int64  `json:"seq"`
	Payload string `json:"payload"`
}

// Kind names the job.
func (peerEvent) Kind() string { return "peer_event" }

func (e peerEvent) message() *message.Message {
	m := message.NewMessage(e.UUID, []byte(e.Payload))
	m.Metadata.Set(forwarder.DefaultKeyMetadataField, e.Key)
	m.Metadata.Set(seqField, strconv.FormatInt(e.Seq, 10))
	return m
}

// newEvent returns the id-th event of a stream spread round-robin over
// keys keys.
func newEvent(id int64, keys int, payload string) peerEvent {
	return peerEvent{
		UUID:    watermill.NewUUID(),
		Key:     "key-" + strconv.FormatInt(id%int64(keys), 10),
		Seq:     id / int64(keys),
		Payload: payload,
	}
}

func comparePeers(ctx context.Context, b *bench, o options) ([]any, error) {
	payload := strings.Repeat("abcdefghijklmnopqrstuvwxyz", payloadBytes/26+1)[:payloadBytes]
	var kv []any
	if len(o.writers) > 0 {
		pairs, err := comparePeerWrites(ctx, b, o, payload)
		if err != nil {
			return nil, err
		}
		kv = append(kv, pairs...)
	}
	if o.n > 0 {
		pairs, err := comparePeerForwards(ctx, b, o, payload)
		if err != nil {
			return nil, err
		}
		kv = append(kv, pairs...)
	}
	return kv, nil
}

// comparePeerWrites times the business transaction with each side's write.
func comparePeerWrites(ctx context.Context, b *bench, o options, payload string) ([]any, error) {
	// An insert-only client with River's defaults, as an application that
	// inserts in its transactions has one.
	inserter, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Schema: b.schema})
	if err != nil {
		return nil, err
	}
	// One publisher made at start, writing in whatever transaction it is
	// handed.
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: b.millbox})
	if err != nil {
		return nil, err
	}
	variants := []writeVariant{
		{"millbox", func(ctx context.Context, tx pgx.Tx, id int64) error {
			return outbox.PublishTx(ctx, pgxv5.WrapTx(tx), outboxTopic, newEvent(id, o.keys, payload).message())
		}},
		{"river", func(ctx context.Context, tx pgx.Tx, id int64) error {
			_, err := inserter.InsertTx(ctx, tx, newEvent(id, o.keys, payload), nil)
			return err
		}},
	}
	fmt.Printf("peers/write: BEGIN, one order row, River InsertTx or millbox PublishTx of one %d-byte event, COMMIT; %v per side and writer count in %d interleaved rounds\n",
		payloadBytes, o.per, writeRounds)
	var kv []any
	for _, w := range o.writers {
		rates, err := writeThroughput(ctx, b, w, o.per, variants)
		if err != nil {
			return nil, err
		}
		ratio := rates["millbox"] / rates["river"]
		fmt.Printf("peers/write: %2d writers  millbox %7.0f tx/s  River %7.0f tx/s  millbox/River %.2f\n", w, rates["millbox"], rates["river"], ratio)
		if w == 8 {
			kv = append(kv, "write_vs_river", ratio,
				"millbox_write_tx_per_s", int(rates["millbox"]), "river_write_tx_per_s", int(rates["river"]))
		} else {
			kv = append(kv, "write"+strconv.Itoa(w)+"_vs_river", ratio)
		}
	}
	return kv, nil
}

// drainResult is what the drains of one side measured.
type drainResult struct {
	msgs    int
	elapsed time.Duration
	order   orderStats
	errors  int // River: Work calls that failed and were retried
}

func (r drainResult) rate() float64 { return float64(r.msgs) / r.elapsed.Seconds() }

// comparePeerForwards prefills the same events into both sides and drains
// each into Kafka, o.rounds times, alternating which side goes first.
func comparePeerForwards(ctx context.Context, b *bench, o options, payload string) ([]any, error) {
	k, err := testenv.NewKafka(testenv.KafkaConfig{})
	if err != nil {
		return nil, err
	}
	defer k.Stop()
	events := make([]peerEvent, o.n)
	for i := range events {
		events[i] = newEvent(int64(i), o.keys, payload)
	}
	fmt.Printf("\npeers/forward: %d events over %d keys, %d-byte payloads, into Kafka (kfake, %d partitions) with watermill-kafka's publisher keyed by the ordering key; River: FetchCooldown %v, FetchPollInterval %v, MaxWorkers %d; millbox: forwarder defaults (BatchSize %d, Concurrency %d)\n",
		o.n, o.keys, payloadBytes, testenv.DefaultKafkaPartitions,
		riverBenchFetchCooldown, riverBenchFetchPollInterval, o.riverWorkers, forwarder.DefaultBatchSize, forwarder.DefaultConcurrency)
	var mill, riv drainResult
	for r := range o.rounds {
		if err := prefillPeers(ctx, b, events); err != nil {
			return nil, err
		}
		sides := []func() error{
			func() error { return drainMillboxToKafka(ctx, b, k, r, o, &mill) },
			func() error { return drainRiverToKafka(ctx, b, k, r, o, &riv) },
		}
		if r%2 == 1 {
			slices.Reverse(sides)
		}
		for _, side := range sides {
			if err := side(); err != nil {
				return nil, err
			}
		}
	}
	ratio := mill.rate() / riv.rate()
	fmt.Printf("peers/forward: millbox %.0f msg/s, River %.0f msg/s, millbox/River %.2f; per-key order violations in %d messages: millbox %d (%d of %d keys), River %d (%d of %d keys)\n",
		mill.rate(), riv.rate(), ratio, mill.msgs, mill.order.violations, mill.order.keys, o.keys, riv.order.violations, riv.order.keys, o.keys)
	return []any{
		"forward_vs_river", ratio,
		"millbox_forward_msgs_per_s", int(mill.rate()),
		"river_forward_msgs_per_s", int(riv.rate()),
		"millbox_in_order", mill.order.inOrder(),
		"millbox_order_violations", mill.order.violations,
		"river_in_order", riv.order.inOrder(),
		"river_order_violations", riv.order.violations,
		"river_keys_out_of_order", riv.order.keys,
		"river_work_errors", riv.errors,
		"duplicates", mill.order.duplicates + riv.order.duplicates,
		"split_keys", mill.order.split + riv.order.split,
	}, nil
}

// prefillPeers empties both outboxes and commits events into each, 5,000
// per transaction, in the order of the slice.
func prefillPeers(ctx context.Context, b *bench, events []peerEvent) error {
	if _, err := b.pool.Exec(ctx, `TRUNCATE `+b.millbox.OutboxTable()+`, "`+b.schema+`".river_job`); err != nil {
		return err
	}
	start := time.Now()
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: b.millbox})
	if err != nil {
		return err
	}
	inserter, err := river.NewClient(riverpgxv5.New(b.pool), &river.Config{Schema: b.schema})
	if err != nil {
		return err
	}
	for chunk := range slices.Chunk(events, perTx) {
		msgs := make([]*message.Message, len(chunk))
		params := make([]river.InsertManyParams, len(chunk))
		for i, e := range chunk {
			msgs[i] = e.message()
			params[i] = river.InsertManyParams{Args: e}
		}
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			return outbox.PublishTx(ctx, pgxv5.WrapTx(tx), outboxTopic, msgs...)
		})
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := inserter.InsertManyFastTx(ctx, tx, params)
			return err
		})
		if err != nil {
			return err
		}
	}
	// Fresh statistics, as autovacuum would have them on a live table.
	if _, err := b.pool.Exec(ctx, `ANALYZE `+b.millbox.OutboxTable()+`; ANALYZE "`+b.schema+`".river_job`); err != nil {
		return err
	}
	fmt.Printf("peers/forward: prefilled %d events into each side in %v\n", len(events), time.Since(start).Round(time.Millisecond))
	return nil
}

// drainTarget is a fresh Kafka topic, a collector reading it back and the
// publisher both sides use.
type drainTarget struct {
	topic string
	col   *testenv.KafkaCollector
	pub   *kafka.Publisher
	addrs []string
}

func newDrainTarget(k *testenv.Kafka, side string, round int) (*drainTarget, error) {
	t := &drainTarget{topic: fmt.Sprintf("%s-%d-%d", side, round, time.Now().UnixNano()), addrs: k.Addrs()}
	var err error
	if t.col, err = testenv.NewKafkaCollector(t.addrs, t.topic); err != nil {
		return nil, err
	}
	if t.pub, err = testenv.NewKafkaPublisher(t.addrs, true); err != nil {
		t.col.Close()
		return nil, err
	}
	return t, nil
}

// close releases the publisher and the collector and deletes the topic, so
// that the cluster's memory does not grow from round to round.
func (t *drainTarget) close() {
	_ = t.pub.Close()
	t.col.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_ = testenv.DeleteKafkaTopics(ctx, t.addrs, t.topic)
}

// await waits until n distinct messages were read back from the topic,
// printing progress every two seconds, or until stopped reports that the
// side gave up.
func (t *drainTarget) await(ctx context.Context, name string, n int, stopped <-chan error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- t.col.WaitN(ctx, n, 10*time.Minute) }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case err := <-stopped:
			return fmt.Errorf("%s stopped before every message reached Kafka: %v", name, err)
		case <-tick.C:
			fmt.Printf("  %s: %d of %d read back from Kafka\n", name, t.col.Distinct(), n)
		}
	}
}

// finish records the drain into res and prints it.
func (t *drainTarget) finish(name string, round int, n int, start time.Time, res *drainResult) error {
	elapsed := t.col.LastFirstArrival().Sub(start)
	order, err := checkOrder(t.col.Records())
	if err != nil {
		return err
	}
	res.msgs += n
	res.elapsed += elapsed
	res.order.add(order)
	fmt.Printf("peers/forward: round %d %-7s %d messages in Kafka after %v = %.0f msg/s; per-key order: %s\n",
		round+1, name, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), order)
	return nil
}

// drainMillboxToKafka runs a forwarder with default settings until every
// prefilled message was read back from Kafka.
func drainMillboxToKafka(ctx context.Context, b *bench, k *testenv.Kafka, round int, o options, res *drainResult) error {
	t, err := newDrainTarget(k, "millbox", round)
	if err != nil {
		return err
	}
	defer t.close()
	f, err := forwarder.New(forwarder.Config{
		DB:          pgxv5.WrapPool(b.pool),
		Dialect:     b.millbox,
		Destination: t.pub,
		Topic:       func(string, *message.Message) (string, error) { return t.topic, nil },
	})
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- f.Run(ctx) }()
	if err := t.await(ctx, "millbox", o.n, errc); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	return t.finish("millbox", round, o.n, start, res)
}

// drainRiverToKafka starts a client tuned as River's benchmark tunes it,
// whose workers publish each job's event to Kafka, until every prefilled
// job's message was read back from Kafka.
func drainRiverToKafka(ctx context.Context, b *bench, k *testenv.Kafka, round int, o options, res *drainResult) error {
	t, err := newDrainTarget(k, "river", round)
	if err != nil {
		return err
	}
	defer t.close()
	workers := river.NewWorkers()
	river.AddWorker(workers, &kafkaWorker{pub: t.pub, topic: t.topic})
	client, err := river.NewClient(riverpgxv5.New(b.pool), riverTuned(b.schema, workers, o.riverWorkers))
	if err != nil {
		return err
	}
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	werr := t.await(ctx, "River", o.n, nil)
	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil && werr == nil {
		werr = err
	}
	if werr != nil {
		return werr
	}
	var errs int
	if err := b.pool.QueryRow(ctx, `SELECT coalesce(sum(coalesce(array_length(errors, 1), 0)), 0) FROM "`+b.schema+`".river_job`).Scan(&errs); err != nil {
		return err
	}
	res.errors += errs
	return t.finish("River", round, o.n, start, res)
}

// kafkaWorker publishes each job's event to Kafka, as the worker of an
// outbox built on River does.
type kafkaWorker struct {
	river.WorkerDefaults[peerEvent]
	pub   message.Publisher
	topic string
}

func (w *kafkaWorker) Work(_ context.Context, job *river.Job[peerEvent]) error {
	return w.pub.Publish(w.topic, job.Args.message())
}

// orderStats counts, in one topic read back partition by partition in
// offset order, the ways the records break per-key order.
type orderStats struct {
	violations int // records that came after a record of the same key with a higher seq
	keys       int // keys with at least one violation
	split      int // keys found on more than one partition
	duplicates int // records beyond the first of a message
}

// add sums the counts of records over drains; keys and split stay the
// most of any one drain, since every drain carries the same keys.
func (s *orderStats) add(o orderStats) {
	s.violations += o.violations
	s.keys = max(s.keys, o.keys)
	s.split = max(s.split, o.split)
	s.duplicates += o.duplicates
}

func (s orderStats) inOrder() bool { return s.violations == 0 && s.split == 0 }

func (s orderStats) String() string {
	if s.inOrder() {
		return fmt.Sprintf("in order (%d duplicates)", s.duplicates)
	}
	return fmt.Sprintf("%d violations in %d keys, %d keys split over partitions (%d duplicates)", s.violations, s.keys, s.split, s.duplicates)
}

// checkOrder reads recs in partition order and counts order violations:
// a message whose seq is below one already seen for its key. Redeliveries
// of a message are counted as duplicates, not as violations.
func checkOrder(recs []testenv.Record) (orderStats, error) {
	slices.SortFunc(recs, func(a, b testenv.Record) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	type keyState struct {
		maxSeq    int64
		partition int32
		bad       bool
		split     bool
	}
	var s orderStats
	seen := make(map[string]bool, len(recs))
	keys := map[string]*keyState{}
	for _, r := range recs {
		if seen[r.UUID] {
			s.duplicates++
			continue
		}
		seen[r.UUID] = true
		seq, err := strconv.ParseInt(r.Metadata[seqField], 10, 64)
		if err != nil {
			return s, fmt.Errorf("message %s in %s[%d]: metadata %q = %q is not a number", r.UUID, r.Topic, r.Partition, seqField, r.Metadata[seqField])
		}
		k := keys[r.Key]
		if k == nil {
			keys[r.Key] = &keyState{maxSeq: seq, partition: r.Partition}
			continue
		}
		if k.partition != r.Partition && !k.split {
			k.split = true
			s.split++
		}
		if seq < k.maxSeq {
			s.violations++
			if !k.bad {
				k.bad = true
				s.keys++
			}
			continue
		}
		k.maxSeq = seq
	}
	return s, nil
}
