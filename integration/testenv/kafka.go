package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	metrics "github.com/rcrowley/go-metrics"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millbox/millbox/forwarder/destination"
)

// DefaultKafkaPartitions is how many partitions topics get when created by
// the helpers or auto-created on first use.
const DefaultKafkaPartitions = 8

// KeyMetadataField is the metadata field the collectors read the ordering
// key from: the one in which the forwarder hands every destination the key
// stored with the row (destination.KeyMetadataField), and millbox's default
// field for producers too.
const KeyMetadataField = destination.KeyMetadataField

// KafkaConfig configures NewKafka.
type KafkaConfig struct {
	// Topics are created at start. Unknown topics are also auto-created on
	// first use (sarama asks for that), so this is only needed to fix the
	// partition count before anyone looks.
	Topics []string

	// Partitions per created or auto-created topic. Defaults to
	// DefaultKafkaPartitions.
	Partitions int

	// DataDir, when set, keeps the cluster's state (topics, records,
	// committed group offsets) on disk so that Restart behaves like a real
	// broker restart. Empty keeps everything in memory: a Restart then
	// comes back empty and topics are auto-created again.
	DataDir string
}

// Kafka is an in-process Kafka cluster (franz-go's kfake) with a single
// broker on a fixed 127.0.0.1 port, so that clients find it at the same
// address after Stop and Restart.
type Kafka struct {
	cfg  KafkaConfig
	port int

	mu      sync.Mutex
	cluster *kfake.Cluster // nil while stopped
}

// StartKafka starts a cluster for the test, keeping its state in a
// temporary directory so Restart preserves records and group offsets. It is
// closed when the test ends.
func StartKafka(t testing.TB, topics ...string) *Kafka {
	t.Helper()
	k, err := NewKafka(KafkaConfig{Topics: topics, DataDir: t.TempDir()})
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(k.Stop)
	return k
}

// NewKafka starts a cluster on a free port. Call Stop to shut it down.
func NewKafka(cfg KafkaConfig) (*Kafka, error) {
	if cfg.Partitions <= 0 {
		cfg.Partitions = DefaultKafkaPartitions
	}
	ln, port, err := listenFreePort()
	if err != nil {
		return nil, err
	}
	k := &Kafka{cfg: cfg, port: port}
	if err := k.start(ln); err != nil {
		return nil, err
	}
	return k, nil
}

// listenFreePort binds a random port below the kernel's ephemeral range:
// a port from that range may be taken by some outgoing connection while
// the broker is stopped, and then Restart could not bind it again.
func listenFreePort() (net.Listener, int, error) {
	var lastErr error
	for range 100 {
		port := 20000 + rand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			return ln, port, nil
		}
		lastErr = err
	}
	return nil, 0, fmt.Errorf("no free port for kfake: %w", lastErr)
}

func (k *Kafka) start(ln net.Listener) error {
	opts := []kfake.Opt{
		kfake.Ports(k.port),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(k.cfg.Partitions),
		kfake.ClusterID("millbox-test"),
		// Hand kfake the listener we already hold, so nobody can take the
		// port between our choice and kfake's bind.
		kfake.ListenFn(func(network, address string) (net.Listener, error) {
			if ln != nil {
				l := ln
				ln = nil
				return l, nil
			}
			return net.Listen(network, address)
		}),
	}
	if len(k.cfg.Topics) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(k.cfg.Partitions), k.cfg.Topics...))
	}
	if k.cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(k.cfg.DataDir))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		if ln != nil {
			_ = ln.Close()
		}
		return fmt.Errorf("kfake on port %d: %w", k.port, err)
	}
	k.mu.Lock()
	k.cluster = c
	k.mu.Unlock()
	return nil
}

// Addrs returns the seed broker addresses. They do not change on Restart.
func (k *Kafka) Addrs() []string { return []string{k.Addr()} }

// Addr returns the broker address, 127.0.0.1:port.
func (k *Kafka) Addr() string { return "127.0.0.1:" + strconv.Itoa(k.port) }

// Cluster returns the running kfake cluster (nil while stopped), for fault
// injection through its Control functions.
func (k *Kafka) Cluster() *kfake.Cluster {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.cluster
}

// Stop shuts the broker down: the listener closes and every client
// connection is dropped, as when a real broker dies. Stopping a stopped
// cluster does nothing.
func (k *Kafka) Stop() {
	k.mu.Lock()
	c := k.cluster
	k.cluster = nil
	k.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// Restart stops the broker if it runs and starts it again on the same port.
// With a DataDir the new broker has the old one's topics, records and group
// offsets. Binding the port again is retried for a few seconds, in case the
// old listener is still being torn down.
func (k *Kafka) Restart() error {
	k.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := k.start(nil)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CreateTopics creates topics with the given number of partitions (0 =
// the cluster's default); topics that exist already are left alone.
func (k *Kafka) CreateTopics(ctx context.Context, partitions int, topics ...string) error {
	if partitions <= 0 {
		partitions = k.cfg.Partitions
	}
	return CreateKafkaTopics(ctx, k.Addrs(), partitions, topics...)
}

// CreateKafkaTopics creates topics with the given number of partitions (-1
// = the broker's default) at addrs; existing topics are not an error.
func CreateKafkaTopics(ctx context.Context, addrs []string, partitions int, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 10000
	for _, topic := range topics {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic = topic
		rt.NumPartitions = int32(partitions)
		rt.ReplicationFactor = -1
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("create topics %v: %w", topics, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", rt.Topic, err)
		}
	}
	return nil
}

// DeleteKafkaTopics deletes topics at addrs, freeing the records they hold;
// unknown topics are not an error.
func DeleteKafkaTopics(ctx context.Context, addrs []string, topics ...string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrDeleteTopicsRequest()
	req.TimeoutMillis = 10000
	for _, topic := range topics {
		rt := kmsg.NewDeleteTopicsRequestTopic()
		rt.Topic = kmsg.StringPtr(topic)
		req.Topics = append(req.Topics, rt)
		req.TopicNames = append(req.TopicNames, topic)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("delete topics %v: %w", topics, err)
	}
	for _, rt := range resp.Topics {
		if err := kerr.ErrorForCode(rt.ErrorCode); err != nil && !errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("delete topic %v: %w", rt.Topic, err)
		}
	}
	return nil
}

var disableSaramaMetrics sync.Once

// KafkaSaramaConfig returns watermill-kafka's default sync producer config
// tuned for tests against a local broker: metadata retries every 250 ms
// instead of every 2 s, acks from all in-sync replicas, short dial timeout.
//
// It also turns off go-metrics (a process-wide switch) before sarama creates
// its first meter: go-metrics ticks all meters from one goroutine that never
// exits, which goleak would report, and which costs CPU on every request.
func KafkaSaramaConfig() *sarama.Config {
	disableSaramaMetrics.Do(func() { metrics.UseNilMetrics = true })
	c := kafka.DefaultSaramaSyncPublisherConfig()
	c.ClientID = "millbox-test"
	c.Net.DialTimeout = 5 * time.Second
	c.Metadata.Retry.Max = 5
	c.Metadata.Retry.Backoff = 250 * time.Millisecond
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Retry.Max = 10
	c.Producer.Retry.Backoff = 100 * time.Millisecond
	return c
}

// KeyMarshaler is watermill-kafka's partitioning marshaler with the
// ordering key the forwarder hands its destination (destination.Key) as the
// Kafka record key, so that one key always lands on one partition and keeps
// its order there.
func KeyMarshaler() kafka.MarshalerUnmarshaler {
	return kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
		return destination.Key(msg), nil
	})
}

// KafkaPublisherConfig returns a watermill-kafka publisher config for addrs
// with KafkaSaramaConfig. keyed selects KeyMarshaler; otherwise records
// carry no key and sarama spreads them over partitions.
func KafkaPublisherConfig(addrs []string, keyed bool) kafka.PublisherConfig {
	var m kafka.Marshaler = kafka.DefaultMarshaler{}
	if keyed {
		m = KeyMarshaler()
	}
	return kafka.PublisherConfig{
		Brokers:               addrs,
		Marshaler:             m,
		OverwriteSaramaConfig: KafkaSaramaConfig(),
	}
}

// NewKafkaPublisher returns a watermill-kafka publisher for addrs, keyed as
// KafkaPublisherConfig says. The caller closes it.
func NewKafkaPublisher(addrs []string, keyed bool) (*kafka.Publisher, error) {
	return kafka.NewPublisher(KafkaPublisherConfig(addrs, keyed), nil)
}

// Publisher returns an unkeyed watermill-kafka publisher, closed after the
// test.
func (k *Kafka) Publisher(t testing.TB) *kafka.Publisher {
	t.Helper()
	return kafkaPublisher(t, k.Addrs(), false)
}

// KeyedPublisher returns a watermill-kafka publisher whose record key is the
// message's ordering key (KeyMarshaler), closed after the test.
func (k *Kafka) KeyedPublisher(t testing.TB) *kafka.Publisher {
	t.Helper()
	return kafkaPublisher(t, k.Addrs(), true)
}

func kafkaPublisher(t testing.TB, addrs []string, keyed bool) *kafka.Publisher {
	t.Helper()
	p, err := NewKafkaPublisher(addrs, keyed)
	if err != nil {
		t.Fatalf("kafka publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Record is one delivery seen by a collector.
type Record struct {
	// UUID is the Watermill message UUID (the header watermill-kafka and
	// watermill-amqp put it in).
	UUID string
	// Topic is the Kafka topic or the AMQP queue.
	Topic string
	// Key is the Kafka record key; for AMQP, the KeyMetadataField header.
	Key string
	// Partition is the Kafka partition; 0 for AMQP.
	Partition int32
	// Offset is the Kafka offset; for AMQP the delivery tag.
	Offset int64
	// Metadata holds the remaining headers.
	Metadata map[string]string
	// Arrived is when the collector received the record.
	Arrived time.Time
}

// Collection is what a collector received, in arrival order. Its methods
// are safe for use while records keep arriving.
type Collection struct {
	mu      sync.Mutex
	recs    []Record
	first   map[string]int // UUID -> index of its first delivery
	changed chan struct{}  // closed and replaced on every add
	err     error          // last consume error, for diagnostics
}

func newCollection() *Collection {
	return &Collection{first: map[string]int{}, changed: make(chan struct{})}
}

func (c *Collection) add(recs ...Record) {
	if len(recs) == 0 {
		return
	}
	c.mu.Lock()
	for _, r := range recs {
		if _, ok := c.first[r.UUID]; !ok {
			c.first[r.UUID] = len(c.recs)
		}
		c.recs = append(c.recs, r)
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *Collection) setErr(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// Len returns the number of deliveries, duplicates included.
func (c *Collection) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs)
}

// Distinct returns the number of distinct UUIDs received.
func (c *Collection) Distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.first)
}

// Duplicates returns the number of deliveries beyond the first of each
// UUID.
func (c *Collection) Duplicates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.recs) - len(c.first)
}

// Records returns a copy of every delivery in arrival order.
func (c *Collection) Records() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.recs)
}

// FirstDeliveries returns the first delivery of each UUID, in arrival order.
func (c *Collection) FirstDeliveries() []Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Record, 0, len(c.first))
	for i, r := range c.recs {
		if c.first[r.UUID] == i {
			out = append(out, r)
		}
	}
	return out
}

// Get returns the first delivery of uuid.
func (c *Collection) Get(uuid string) (Record, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, ok := c.first[uuid]
	if !ok {
		return Record{}, false
	}
	return c.recs[i], true
}

// LastFirstArrival returns when the most recent new UUID arrived: with all
// expected messages in, the moment the last of them got there.
func (c *Collection) LastFirstArrival() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var last time.Time
	for _, i := range c.first {
		if a := c.recs[i].Arrived; a.After(last) {
			last = a
		}
	}
	return last
}

// WaitN waits until n distinct UUIDs arrived, ctx ends or timeout (0 = no
// limit besides ctx) passes. The error says how many arrived and, for keys
// whose messages carry a "seq" metadata number, which numbers are missing.
func (c *Collection) WaitN(ctx context.Context, n int, timeout time.Duration) error {
	return c.wait(ctx, timeout, func() bool { return len(c.first) >= n }, func() string {
		return fmt.Sprintf("%d of %d distinct messages arrived (%d deliveries)%s", len(c.first), n, len(c.recs), c.seqGapsLocked("seq"))
	})
}

// WaitUUIDs waits until every one of uuids arrived, ctx ends or timeout (0
// = no limit besides ctx) passes; the error lists the missing UUIDs.
func (c *Collection) WaitUUIDs(ctx context.Context, uuids []string, timeout time.Duration) error {
	missing := func() []string {
		var m []string
		for _, u := range uuids {
			if _, ok := c.first[u]; !ok {
				m = append(m, u)
			}
		}
		return m
	}
	return c.wait(ctx, timeout, func() bool { return len(missing()) == 0 }, func() string {
		m := missing()
		return fmt.Sprintf("%d of %d messages missing: %s", len(m), len(uuids), abbreviate(m, 20))
	})
}

func (c *Collection) wait(ctx context.Context, timeout time.Duration, done func() bool, describe func() string) error {
	start := time.Now()
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	for {
		c.mu.Lock()
		if done() {
			c.mu.Unlock()
			return nil
		}
		changed := c.changed
		c.mu.Unlock()
		var why string
		select {
		case <-changed:
			continue
		case <-ctx.Done():
			why = ctx.Err().Error()
		case <-timer:
			why = "timeout"
		}
		c.mu.Lock()
		msg := describe()
		if c.err != nil {
			msg += "; last consume error: " + c.err.Error()
		}
		c.mu.Unlock()
		return fmt.Errorf("after %v (%s): %s", time.Since(start).Round(time.Millisecond), why, msg)
	}
}

// seqGapsLocked describes, for up to 10 keys, the numbers missing between
// the lowest and highest metadata field seen.
func (c *Collection) seqGapsLocked(field string) string {
	seen := map[string]map[int64]bool{}
	for _, i := range c.first {
		r := c.recs[i]
		s, err := strconv.ParseInt(r.Metadata[field], 10, 64)
		if err != nil {
			continue
		}
		if seen[r.Key] == nil {
			seen[r.Key] = map[int64]bool{}
		}
		seen[r.Key][s] = true
	}
	var parts []string
	for _, key := range sortedKeys(seen) {
		set := seen[key]
		lo, hi := int64(1<<62), int64(-1<<62)
		for s := range set {
			lo, hi = min(lo, s), max(hi, s)
		}
		var gaps []string
		for s := lo; s <= hi && len(gaps) <= 5; s++ {
			if !set[s] {
				gaps = append(gaps, strconv.FormatInt(s, 10))
			}
		}
		if len(gaps) > 0 {
			parts = append(parts, fmt.Sprintf("%s: %s", key, abbreviate(gaps, 5)))
		}
		if len(parts) == 10 {
			parts = append(parts, "…")
			break
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "; missing " + field + " per key: " + strings.Join(parts, "; ")
}

// CheckSeqOrder checks that, for every key, the first deliveries carry
// strictly increasing integers in the metadata field seqField (redeliveries
// of earlier messages are allowed), and that one key never spans two
// partitions. It does not check completeness: use WaitN or WaitUUIDs.
func (c *Collection) CheckSeqOrder(seqField string) error {
	type last struct {
		seq       int64
		uuid      string
		partition int32
	}
	lasts := map[string]last{}
	var errs []string
	for _, r := range c.FirstDeliveries() {
		s, err := strconv.ParseInt(r.Metadata[seqField], 10, 64)
		if err != nil {
			return fmt.Errorf("message %s: metadata %q = %q is not an integer", r.UUID, seqField, r.Metadata[seqField])
		}
		l, ok := lasts[r.Key]
		switch {
		case ok && l.partition != r.Partition:
			errs = append(errs, fmt.Sprintf("key %q on partitions %d and %d", r.Key, l.partition, r.Partition))
		case ok && s <= l.seq:
			errs = append(errs, fmt.Sprintf("key %q: %s=%d (%s) arrived after %d (%s)", r.Key, seqField, s, r.UUID, l.seq, l.uuid))
		}
		lasts[r.Key] = last{seq: max(s, l.seq), uuid: r.UUID, partition: r.Partition}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d order violations: %s", len(errs), abbreviate(errs, 10))
	}
	return nil
}

// CheckOrder checks arrival order against expected: for each key, the
// UUIDs in the order they were committed. Every expected UUID must have
// arrived, and first deliveries of one key must follow that order.
func (c *Collection) CheckOrder(expected map[string][]string) error {
	c.mu.Lock()
	pos := make(map[string]int, len(c.first))
	for u, i := range c.first {
		pos[u] = i
	}
	recs := c.recs
	c.mu.Unlock()
	var errs []string
	for _, key := range sortedKeys(expected) {
		prev, prevUUID := -1, ""
		for _, u := range expected[key] {
			i, ok := pos[u]
			if !ok {
				errs = append(errs, fmt.Sprintf("key %q: %s missing", key, u))
				continue
			}
			if i < prev {
				errs = append(errs, fmt.Sprintf("key %q: %s arrived before %s", key, u, prevUUID))
			}
			if prevUUID != "" && recs[i].Partition != recs[prev].Partition {
				errs = append(errs, fmt.Sprintf("key %q on partitions %d and %d", key, recs[prev].Partition, recs[i].Partition))
			}
			prev, prevUUID = max(prev, i), u
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d order violations: %s", len(errs), abbreviate(errs, 10))
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func abbreviate(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(", … (%d more)", len(items)-n)
}

// KafkaCollector consumes every partition of its topics from the start,
// without a consumer group (nothing to rebalance, nothing to commit), and
// records each record in its Collection.
type KafkaCollector struct {
	*Collection
	cl     *kgo.Client
	cancel context.CancelFunc
	done   chan struct{}
}

// NewKafkaCollector creates the topics if needed (with the broker's default
// partition count) and starts consuming them. The caller calls Close.
func NewKafkaCollector(addrs []string, topics ...string) (*KafkaCollector, error) {
	return newKafkaCollector(addrs, nil, topics)
}

// NewKafkaCommittedCollector is NewKafkaCollector reading with
// read_committed isolation: records of transactions that are open or
// were aborted are not collected.
func NewKafkaCommittedCollector(addrs []string, topics ...string) (*KafkaCollector, error) {
	return newKafkaCollector(addrs, []kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, topics)
}

func newKafkaCollector(addrs []string, extra []kgo.Opt, topics []string) (*KafkaCollector, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := CreateKafkaTopics(ctx, addrs, -1, topics...); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(addrs...),
		kgo.ClientID("millbox-collector"),
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.MetadataMinAge(250 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	}, extra...)...)
	if err != nil {
		return nil, err
	}
	ctx, cancel = context.WithCancel(context.Background())
	c := &KafkaCollector{Collection: newCollection(), cl: cl, cancel: cancel, done: make(chan struct{})}
	go c.run(ctx)
	return c, nil
}

// CollectKafka starts a KafkaCollector for the test, closed after it.
func CollectKafka(t testing.TB, addrs []string, topics ...string) *KafkaCollector {
	t.Helper()
	c, err := NewKafkaCollector(addrs, topics...)
	if err != nil {
		t.Fatalf("kafka collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// CollectKafkaCommitted starts a read_committed KafkaCollector for the
// test, closed after it.
func CollectKafkaCommitted(t testing.TB, addrs []string, topics ...string) *KafkaCollector {
	t.Helper()
	c, err := NewKafkaCommittedCollector(addrs, topics...)
	if err != nil {
		t.Fatalf("kafka collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Collect starts a KafkaCollector on this cluster, closed after the test.
func (k *Kafka) Collect(t testing.TB, topics ...string) *KafkaCollector {
	t.Helper()
	return CollectKafka(t, k.Addrs(), topics...)
}

func (c *KafkaCollector) run(ctx context.Context) {
	defer close(c.done)
	var batch []Record
	for {
		fetches := c.cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		fetches.EachError(func(topic string, p int32, err error) {
			c.setErr(fmt.Errorf("%s[%d]: %w", topic, p, err))
		})
		batch = batch[:0]
		fetches.EachRecord(func(r *kgo.Record) {
			rec := Record{
				Topic:     r.Topic,
				Key:       string(r.Key),
				Partition: r.Partition,
				Offset:    r.Offset,
				Metadata:  make(map[string]string, len(r.Headers)),
				Arrived:   now,
			}
			for _, h := range r.Headers {
				if h.Key == kafka.UUIDHeaderKey {
					rec.UUID = string(h.Value)
				} else {
					rec.Metadata[h.Key] = string(h.Value)
				}
			}
			batch = append(batch, rec)
		})
		c.add(batch...)
	}
}

// Close stops consuming. The records collected so far stay readable.
func (c *KafkaCollector) Close() {
	c.cancel()
	<-c.done
	c.cl.Close()
}
