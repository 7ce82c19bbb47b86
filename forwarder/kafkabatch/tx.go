package kafkabatch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/millbox/millbox/forwarder/destination"
)

// Defaults of TxConfig.
const (
	DefaultControlTopic       = "millbox-outbox-progress"
	DefaultTransactionTimeout = 20 * time.Second
)

// controlPartition is where progress records go: one partition, so that
// adding partitions to the control topic never moves a key's record.
const controlPartition = 0

// TxConfig configures a TxPublisher.
type TxConfig struct {
	// Config is the Kafka client's: brokers, marshaler, DeliveryTimeout
	// (which, when set, bounds each transaction, its produce, commit and
	// abort together, and each claim, within the forwarder's
	// PublishTimeout), and further options.
	Config
	// TransactionalID names the outbox at the brokers. Each partition of
	// the outbox has a transactional producer of its own, with the
	// transactional.id TransactionalID-<partition>, and its progress
	// records carry the key TransactionalID/<partition>. Required. It must
	// be unique per outbox among everything that uses the Kafka cluster
	// and must not change while rows are in flight: forwarders of two
	// outboxes with one TransactionalID fence each other and read each
	// other's progress (and remove rows by the other's ids).
	TransactionalID string
	// ControlTopic holds the progress records. It must be compacted
	// (cleanup.policy=compact, no retention deletion): a deleted record
	// could make a new holder of a partition publish rows again. PrepareTx
	// creates it (one partition, compacted) when it is missing and refuses
	// one that is not compacted. Several outboxes may share it. Defaults
	// to DefaultControlTopic.
	ControlTopic string
	// TransactionTimeout is how long the brokers keep a transaction open
	// before they abort it: read_committed consumers of the partitions it
	// wrote wait for it to end, so after a crash they may wait this long
	// unless another forwarder takes the outbox partition over (and
	// fences the crashed one's transaction) sooner. It also bounds each
	// transaction PublishTx runs when it ends before the forwarder's
	// PublishTimeout: a transaction open longer cannot commit, so
	// PublishTx gives it up then instead of waiting for the forwarder's
	// deadline (at the defaults, a hung transaction is given up after 20
	// s, the forwarder's PublishTimeout being 30 s). It must be longer than
	// DeliveryTimeout when that is set, and the brokers'
	// transaction.max.timeout.ms (15 minutes by default) must allow it.
	// Defaults to DefaultTransactionTimeout.
	TransactionTimeout time.Duration
}

// TxPublisher publishes the forwarder's rows in Kafka transactions, for a
// forwarder with Config.ExactlyOnce: it implements
// destination.TxDestination. Each partition of the outbox gets a
// transactional producer of its own, whose transactional.id derives from
// TxConfig.TransactionalID and the partition, so a forwarder that takes a
// partition over fences the previous holder: the broker aborts the
// previous holder's open transaction and refuses its later commits. Each
// transaction also writes the forwarder's progress to the control topic
// (TxConfig.ControlTopic), which the next holder reads with read_committed
// before it reads the outbox (see the package doc).
//
// Publish is refused: a TxPublisher publishes only through a forwarder.
type TxPublisher struct {
	cfg  TxConfig
	base *Publisher // idempotent, not transactional: records, checks, claim marks
	// prodOpts are the options of the transactional producers but their
	// transactional.id.
	prodOpts []kgo.Opt

	mu        sync.Mutex
	producers map[int]*kgo.Client
	closed    bool
}

var (
	_ message.Publisher         = (*TxPublisher)(nil)
	_ destination.TxDestination = (*TxPublisher)(nil)
)

// ErrNotTransactional is returned by TxPublisher.Publish: a TxPublisher
// publishes only through a forwarder with Config.ExactlyOnce.
var ErrNotTransactional = errors.New("millbox: kafkabatch: a TxPublisher publishes only through a forwarder with Config.ExactlyOnce (use a Publisher elsewhere)")

// NewTxPublisher validates cfg and creates the Kafka client. It does not
// contact the brokers: the forwarder's PrepareTx does, at start.
func NewTxPublisher(cfg TxConfig) (*TxPublisher, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: kafkabatch.TxConfig."+format, append([]any{destination.ErrInvalidConfig}, args...)...)
	}
	if cfg.ControlTopic == "" {
		cfg.ControlTopic = DefaultControlTopic
	}
	if cfg.TransactionTimeout == 0 {
		cfg.TransactionTimeout = DefaultTransactionTimeout
	}
	switch {
	case cfg.TransactionalID == "":
		return nil, bad("TransactionalID is required: it names the outbox at the brokers, unique per outbox")
	case len(cfg.TransactionalID) > 200 || strings.ContainsAny(cfg.TransactionalID, "/\x00"):
		return nil, bad("TransactionalID must be at most 200 bytes, without '/' or NUL, got %q", cfg.TransactionalID)
	case cfg.TransactionTimeout < time.Second:
		return nil, bad("TransactionTimeout must be at least 1s, got %v", cfg.TransactionTimeout)
	}
	partitioner := controlPartitioner{control: cfg.ControlTopic, inner: kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a))}
	base, err := newPublisher(cfg.Config, partitioner)
	if err != nil {
		return nil, err
	}
	if base.timeout > 0 && base.timeout >= cfg.TransactionTimeout {
		base.Close()
		return nil, bad("TransactionTimeout (%v) must be longer than DeliveryTimeout (%v)", cfg.TransactionTimeout, base.timeout)
	}
	return &TxPublisher{
		cfg:       cfg,
		base:      base,
		prodOpts:  append(producerOptions(cfg.Config, base.conns, partitioner, false), kgo.TransactionTimeout(cfg.TransactionTimeout)),
		producers: map[int]*kgo.Client{},
	}, nil
}

// controlPartitioner places the control topic's records on the partition
// they name, and every other record as the Publisher does.
type controlPartitioner struct {
	control string
	inner   kgo.Partitioner
}

func (p controlPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	if topic == p.control {
		return kgo.ManualPartitioner().ForTopic(topic)
	}
	return p.inner.ForTopic(topic)
}

// Publish implements message.Publisher: it refuses, see
// ErrNotTransactional.
func (p *TxPublisher) Publish(string, ...*message.Message) error { return ErrNotTransactional }

// PrepareTx implements destination.TxDestination: the control topic exists
// (it is created, compacted, when missing) and is compacted, and the
// brokers grant transactions to TransactionalID.
func (p *TxPublisher) PrepareTx(ctx context.Context) error {
	if err := p.ensureControlTopic(ctx); err != nil {
		return err
	}
	// A transactional id of its own: initializing a partition's would
	// fence the forwarder that holds it.
	id := p.cfg.TransactionalID + "-check"
	cl, err := kgo.NewClient(append(p.prodOpts[:len(p.prodOpts):len(p.prodOpts)], kgo.TransactionalID(id))...)
	if err != nil {
		return fmt.Errorf("%w: kafkabatch: %w", destination.ErrInvalidConfig, err)
	}
	defer cl.Close()
	ctx, cancel, lim := p.base.bound(ctx)
	defer cancel()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		return fmt.Errorf("kafkabatch: the brokers did not grant a transaction to transactional.id %q (transactions need Kafka 0.11 or later, a transaction state log the brokers can write, and, with ACLs, WRITE on the transactional ids %s-*): %w",
			id, p.cfg.TransactionalID, p.base.classify(ctx, lim, err))
	}
	return nil
}

// ensureControlTopic creates the control topic when it is missing and
// checks that it is compacted.
func (p *TxPublisher) ensureControlTopic(ctx context.Context) error {
	ctx, cancel, lim := p.base.bound(ctx)
	defer cancel()
	topic := p.cfg.ControlTopic
	policy, found, err := p.cleanupPolicy(ctx, lim)
	if err != nil {
		return err
	}
	if !found {
		req := kmsg.NewPtrCreateTopicsRequest()
		req.TimeoutMillis = int32(lim.d / time.Millisecond)
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, -1
		c := kmsg.NewCreateTopicsRequestTopicConfig()
		c.Name, c.Value = "cleanup.policy", kmsg.StringPtr("compact")
		rt.Configs = append(rt.Configs, c)
		req.Topics = append(req.Topics, rt)
		resp, err := req.RequestWith(ctx, p.base.client)
		if err != nil {
			return fmt.Errorf("kafkabatch: create the control topic %q: %w", topic, p.base.classify(ctx, lim, err))
		}
		if len(resp.Topics) == 1 {
			if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
				return fmt.Errorf("kafkabatch: create the control topic %q (compacted, 1 partition; or create it yourself): %w", topic, err)
			}
		}
		if policy, _, err = p.cleanupPolicy(ctx, lim); err != nil {
			return err
		}
	}
	if policy != "compact" {
		return fmt.Errorf("%w: kafkabatch: the control topic %q has cleanup.policy=%q; it must be \"compact\" alone, "+
			"or a progress record could be deleted and rows published again (kafka-configs --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact)",
			destination.ErrInvalidConfig, topic, policy, topic)
	}
	return nil
}

// cleanupPolicy reads the control topic's cleanup.policy; ctx is bounded
// by lim.
func (p *TxPublisher) cleanupPolicy(ctx context.Context, lim limit) (policy string, found bool, err error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	rr := kmsg.NewDescribeConfigsRequestResource()
	rr.ResourceType, rr.ResourceName = kmsg.ConfigResourceTypeTopic, p.cfg.ControlTopic
	rr.ConfigNames = []string{"cleanup.policy"}
	req.Resources = append(req.Resources, rr)
	resp, err := req.RequestWith(ctx, p.base.client)
	if err != nil {
		return "", false, fmt.Errorf("kafkabatch: describe the control topic %q: %w", p.cfg.ControlTopic, p.base.classify(ctx, lim, err))
	}
	if len(resp.Resources) != 1 {
		return "", false, fmt.Errorf("kafkabatch: describe the control topic %q: %d resources in the answer", p.cfg.ControlTopic, len(resp.Resources))
	}
	res := resp.Resources[0]
	if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("kafkabatch: describe the control topic %q: %w", p.cfg.ControlTopic, err)
	}
	policy = "delete" // Kafka's default
	for _, c := range res.Configs {
		if c.Name == "cleanup.policy" && c.Value != nil {
			policy = *c.Value
		}
	}
	return policy, true, nil
}

func (p *TxPublisher) transactionalID(partition int) string {
	return p.cfg.TransactionalID + "-" + strconv.Itoa(partition)
}

func (p *TxPublisher) progressKey(partition int) []byte {
	return []byte(p.cfg.TransactionalID + "/" + strconv.Itoa(partition))
}

// ClaimPartition implements destination.TxDestination. It initializes the
// partition's transactional producer, which makes the brokers abort the
// previous holder's open transaction and refuse its later ones, and then
// reads the partition's progress record with read_committed, up to a mark
// it writes after the fencing: every transaction of the partition that
// committed is visible by then.
func (p *TxPublisher) ClaimPartition(ctx context.Context, partition int) ([]byte, error) {
	p.drop(partition, nil)
	cl, err := kgo.NewClient(append(p.prodOpts[:len(p.prodOpts):len(p.prodOpts)], kgo.TransactionalID(p.transactionalID(partition)))...)
	if err != nil {
		return nil, fmt.Errorf("kafkabatch: %w", err)
	}
	ctx, cancel, lim := p.base.bound(ctx)
	defer cancel()
	if _, _, err := cl.ProducerID(ctx); err != nil {
		cl.Close()
		return nil, fmt.Errorf("kafkabatch: initialize the transactional producer %q: %w", p.transactionalID(partition), p.base.classify(ctx, lim, err))
	}
	progress, err := p.readProgress(ctx, lim, partition)
	if err != nil {
		cl.Close()
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		cl.Close()
		return nil, fmt.Errorf("millbox: kafkabatch: %w", destination.ErrClosed)
	}
	if old := p.producers[partition]; old != nil {
		old.Close()
	}
	p.producers[partition] = cl
	return progress, nil
}

// readProgress writes a mark to the control partition and reads it with
// read_committed from the start up to that mark; it returns the value of
// the partition's last progress record. ctx is bounded by lim.
func (p *TxPublisher) readProgress(ctx context.Context, lim limit, partition int) ([]byte, error) {
	key := p.progressKey(partition)
	markKey := append(bytes.Clone(key), "/claim"...)
	nonce := make([]byte, 16)
	_, _ = rand.Read(nonce)
	mark := []byte(hex.EncodeToString(nonce))
	topic := p.cfg.ControlTopic
	if err := p.base.client.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: controlPartition, Key: markKey, Value: mark}).FirstErr(); err != nil {
		return nil, fmt.Errorf("kafkabatch: write a claim mark to the control topic %q: %w", topic, p.base.classify(ctx, lim, err))
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {controlPartition: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.WithHooks(p.base.conns),
	}, p.cfg.Options...)...)
	if err != nil {
		return nil, fmt.Errorf("kafkabatch: %w", err)
	}
	defer cl.Close()
	var progress []byte
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("kafkabatch: read the progress of partition %d from the control topic %q: %w", partition, topic, p.base.classify(ctx, lim, ctx.Err()))
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			switch {
			case done:
			case bytes.Equal(r.Key, key):
				progress = r.Value
			case bytes.Equal(r.Key, markKey) && bytes.Equal(r.Value, mark):
				done = true
			}
		})
		if done {
			return progress, nil
		}
	}
}

// producer returns partition's transactional producer, nil when it is not
// claimed.
func (p *TxPublisher) producer(partition int) *kgo.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.producers[partition]
}

// drop closes partition's producer: cl, or whichever it has when cl is
// nil.
func (p *TxPublisher) drop(partition int, cl *kgo.Client) {
	p.mu.Lock()
	cur := p.producers[partition]
	if cur != nil && (cl == nil || cur == cl) {
		delete(p.producers, partition)
	} else {
		cur = nil
	}
	p.mu.Unlock()
	if cur != nil {
		cur.Close()
	}
}

// ReleasePartition implements destination.TxDestination: it closes the
// partition's producer.
func (p *TxPublisher) ReleasePartition(partition int) { p.drop(partition, nil) }

// errNotClaimed is returned for a partition whose producer was closed (a
// failed abort, a release).
var errNotClaimed = errors.New("millbox: kafkabatch: the partition is not claimed")

// PublishTx implements destination.TxDestination: one transaction of the
// partition's producer with the batches' records and the progress record.
// Messages that cannot be produced (marshaling, a record larger than a
// batch may be) fail their batch before the transaction begins. When the
// brokers refuse records, the transaction is aborted and the batches of
// the refused records reported (destination.TxAbortedError). A commit that
// fails, and records refused because another holder fenced this one,
// leave the outcome to the next ClaimPartition: the producer is closed.
//
// The transaction (its records, commit or abort) ends by ctx's deadline
// (the forwarder's PublishTimeout), DeliveryTimeout or TransactionTimeout
// after it began, whichever comes first: the brokers abort a transaction
// open longer than TransactionTimeout, so it could not commit later. A
// transaction that does not end in time closes the producer, and its
// outcome is left to the next ClaimPartition.
func (p *TxPublisher) PublishTx(ctx context.Context, partition int, batches []destination.TxBatch, progress []byte) error {
	cl := p.producer(partition)
	if cl == nil {
		return fmt.Errorf("%w (partition %d)", errNotClaimed, partition)
	}
	records := make([]*kgo.Record, 0, 1+len(batches))
	owner := make(map[*kgo.Record]int, len(batches))
	failed := map[int]error{}
	for i, b := range batches {
		for _, m := range b.Messages {
			r, err := p.base.record(m.Topic, m.Message)
			if err != nil {
				failed[i] = err
				break
			}
			records = append(records, r)
			owner[r] = i
		}
	}
	if len(failed) > 0 {
		return &destination.TxAbortedError{Failed: failed}
	}
	ctx, cancel, lim := p.base.boundBy(ctx, limit{p.cfg.TransactionTimeout, "TransactionTimeout"})
	defer cancel()
	records = append(records, &kgo.Record{Topic: p.cfg.ControlTopic, Partition: controlPartition, Key: p.progressKey(partition), Value: progress})
	for _, r := range records {
		r.Context = ctx
	}
	if err := cl.BeginTransaction(); err != nil {
		p.drop(partition, cl)
		return fmt.Errorf("kafkabatch: begin a transaction of partition %d: %w", partition, err)
	}
	// A transactional producer does not fail records in flight at their
	// deadline: past it, the producer is dropped (closing it fails them),
	// and the partition's next claim aborts the transaction.
	results := make(chan kgo.ProduceResults, 1)
	go func() { results <- cl.ProduceSync(context.Background(), records...) }()
	var produced kgo.ProduceResults
	select {
	case produced = <-results:
	case <-ctx.Done():
		p.drop(partition, cl)
		<-results
		return fmt.Errorf("kafkabatch: partition %d: %w", partition, p.base.classify(ctx, lim, ctx.Err()))
	}
	var first error
	for _, res := range produced {
		if res.Err == nil {
			continue
		}
		err := p.base.classify(ctx, lim, res.Err)
		if fencedErr(res.Err) {
			p.drop(partition, cl)
			return fmt.Errorf("kafkabatch: partition %d: %w: %w", partition, destination.ErrFenced, res.Err)
		}
		if i, ok := owner[res.Record]; ok {
			if _, seen := failed[i]; !seen {
				failed[i] = fmt.Errorf("millbox: kafkabatch: message %s to %s not acknowledged: %w", batches[i].Messages[0].Message.UUID, res.Record.Topic, err)
			}
		} else if first == nil {
			first = fmt.Errorf("millbox: kafkabatch: progress record not acknowledged: %w", err)
		}
	}
	if len(failed) == 0 && first == nil {
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			// Committed or not, the next holder of the partition knows
			// from the progress it reads.
			p.drop(partition, cl)
			if fencedErr(err) {
				err = fmt.Errorf("%w: %w", destination.ErrFenced, err)
			}
			return fmt.Errorf("kafkabatch: commit a transaction of partition %d (outcome unknown): %w", partition, p.base.classify(ctx, lim, err))
		}
		return nil
	}
	// Nothing of it commits: abort, so that read_committed consumers do
	// not wait for the transaction timeout. When the abort fails (or does
	// not end in time), the producer is dropped; the partition's next
	// claim aborts it.
	aerr := cl.AbortBufferedRecords(ctx)
	if aerr == nil {
		aerr = cl.EndTransaction(ctx, kgo.TryAbort)
	}
	if aerr != nil {
		p.drop(partition, cl)
	}
	return &destination.TxAbortedError{Failed: failed, Err: first}
}

// fencedErr tells that another producer with the transactional.id took
// over.
func fencedErr(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// Close closes every partition's producer and the client.
func (p *TxPublisher) Close() error {
	p.mu.Lock()
	p.closed = true
	producers := p.producers
	p.producers = map[int]*kgo.Client{}
	p.mu.Unlock()
	for _, cl := range producers {
		cl.Close()
	}
	return p.base.Close()
}
