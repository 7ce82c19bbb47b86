package kafkabatch

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/forwarder/destination"
)

// DefaultDeliveryTimeout bounds a call whose context has no deadline, when
// Config.DeliveryTimeout is not set.
const DefaultDeliveryTimeout = 10 * time.Second

// batchOverhead is what a record batch adds around its records (the
// batch header and length prefixes), rounded up.
const batchOverhead = 128

// Config configures a Publisher.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Marshaler turns messages into Kafka records. Defaults to
	// watermill-kafka's partitioning marshaler keyed by destination.Key:
	// the ordering key the forwarder stored with the row, whatever
	// metadata field the producer set it in. Kafka keeps order per
	// partition: a marshaler that does not use the ordering key as the
	// record key spreads a key's messages over partitions, and their
	// order with them.
	Marshaler kafka.Marshaler
	// DeliveryTimeout bounds one call when it ends before the call's own
	// deadline. A call's deadline is that of its context: the first
	// message's context in Publish (msgs[0].Context()), ctx in a
	// TxPublisher's methods; the forwarder sets it at its PublishTimeout,
	// so that a call gives up when the forwarder does. The messages Kafka
	// has not acknowledged by then fail, with an error that wraps
	// destination.ErrDestinationUnavailable and names the limit. Defaults
	// to 0: the call's deadline alone, and DefaultDeliveryTimeout for a
	// call whose context has none.
	DeliveryTimeout time.Duration
	// Options are further franz-go client options (TLS, SASL, client
	// id, ...), applied after the publisher's own: seed brokers,
	// idempotent writes with acks from all in-sync replicas,
	// cancellation of in-flight records at the call's limit, sarama's
	// partitioner (a key lands on the partition watermill-kafka's
	// publisher picks) and automatic topic creation (as sarama asks
	// for). Idempotent writes must stay on: NewPublisher refuses
	// kgo.DisableIdempotentWrite.
	Options []kgo.Opt
}

// Publisher sends each Publish call's messages in one produce and tells
// which of them Kafka acknowledged.
type Publisher struct {
	client    *kgo.Client
	marshaler kafka.Marshaler
	timeout   time.Duration // Config.DeliveryTimeout, 0 for none
	conns     *connState

	maxBatchBytes    func(topic string) int32
	maxBufferedBytes int64

	// ctx ends on Close, failing calls in flight.
	ctx    context.Context
	cancel context.CancelFunc
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and creates the Kafka client. It does not
// contact the brokers: the first Publish does.
func NewPublisher(cfg Config) (*Publisher, error) {
	return newPublisher(cfg, kgo.StickyKeyPartitioner(kgo.SaramaCompatHasher(fnv32a)))
}

func newPublisher(cfg Config, partitioner kgo.Partitioner) (*Publisher, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: kafkabatch.Config.Brokers is required", destination.ErrInvalidConfig)
	}
	if cfg.DeliveryTimeout < 0 {
		return nil, fmt.Errorf("%w: kafkabatch.Config.DeliveryTimeout must not be negative", destination.ErrInvalidConfig)
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = kafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return destination.Key(m), nil
		})
	}
	conns := &connState{}
	client, err := kgo.NewClient(producerOptions(cfg, conns, partitioner, true)...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafkabatch: %w", destination.ErrInvalidConfig, err)
	}
	if off, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); off {
		client.Close()
		return nil, fmt.Errorf("%w: kafkabatch.Config.Options must not disable idempotent writes: without them a retried batch can land after a later one", destination.ErrInvalidConfig)
	}
	p := &Publisher{
		client:    client,
		marshaler: cfg.Marshaler,
		timeout:   cfg.DeliveryTimeout,
		conns:     conns,
	}
	p.maxBatchBytes, _ = client.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
	p.maxBufferedBytes, _ = client.OptValue(kgo.MaxBufferedBytes).(int64)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// producerOptions are the options of the publisher's clients; cancel
// allows failing records in flight at their deadline, which transactional
// producers may not.
func producerOptions(cfg Config, conns *connState, partitioner kgo.Partitioner, cancel bool) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(partitioner),
		kgo.AllowAutoTopicCreation(),
		kgo.WithHooks(conns),
	}
	if cancel {
		opts = append(opts, kgo.AllowIdempotentProduceCancellation())
	}
	return append(opts, cfg.Options...)
}

func fnv32a(b []byte) uint32 {
	h := fnv.New32a()
	_, _ = h.Write(b)
	return h.Sum32()
}

// Publish produces msgs to topic and waits for Kafka's acknowledgements,
// until the deadline of the first message's context (the forwarder's
// PublishTimeout) or Config.DeliveryTimeout, whichever ends first.
//
// It returns nil when every message was acknowledged. Otherwise it returns
// a *destination.PartialError when a prefix of msgs was acknowledged, or a
// plain error when none was; either way no message after the first failed
// one was written (see the package doc). Failures of the broker rather
// than of a message (unreachable, connection lost, no answer in time) wrap
// destination.ErrDestinationUnavailable.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if p.ctx.Err() != nil {
		return fmt.Errorf("millbox: kafkabatch: %w", destination.ErrClosed)
	}
	// Messages that cannot be produced at all end the call before them,
	// so that Kafka never gets a later message of the key without them.
	records := make([]*kgo.Record, 0, len(msgs))
	var stop error
	for _, m := range msgs {
		r, err := p.record(topic, m)
		if err != nil {
			stop = err
			break
		}
		records = append(records, r)
	}
	delivered, err := p.produce(msgs[0].Context(), topic, msgs, records)
	switch {
	case err == nil && stop == nil:
		return nil
	case err == nil:
		err = stop
	}
	if delivered == 0 {
		return err
	}
	return &destination.PartialError{Delivered: delivered, Err: err}
}

// record marshals m and checks that the client will take it.
func (p *Publisher) record(topic string, m *message.Message) (*kgo.Record, error) {
	pm, err := p.marshaler.Marshal(topic, m)
	if err != nil {
		return nil, fmt.Errorf("millbox: kafkabatch: marshal message %s: %w", m.UUID, err)
	}
	r := &kgo.Record{Topic: pm.Topic, Headers: make([]kgo.RecordHeader, len(pm.Headers))}
	if r.Topic == "" {
		r.Topic = topic
	}
	if r.Key, err = encode(pm.Key); err == nil {
		r.Value, err = encode(pm.Value)
	}
	if err != nil {
		return nil, fmt.Errorf("millbox: kafkabatch: encode message %s: %w", m.UUID, err)
	}
	// Upper bounds of the record's size in a batch (varints at their
	// widest) and in the client's buffer.
	user := len(r.Key) + len(r.Value)
	wire := 5 + 1 + 10 + 5 + 5 + len(r.Key) + 5 + len(r.Value) + 5
	for i, h := range pm.Headers {
		r.Headers[i] = kgo.RecordHeader{Key: string(h.Key), Value: h.Value}
		user += len(h.Key) + len(h.Value)
		wire += 5 + len(h.Key) + 5 + len(h.Value)
	}
	limit := int32(1 << 30)
	if p.maxBatchBytes != nil {
		limit = p.maxBatchBytes(r.Topic)
	}
	if wire+batchOverhead > int(limit) || (p.maxBufferedBytes > 0 && int64(user) > p.maxBufferedBytes) {
		return nil, fmt.Errorf("millbox: kafkabatch: message %s (%d bytes) is larger than a record batch may be (%d bytes): %w",
			m.UUID, wire, limit, kerr.MessageTooLarge)
	}
	return r, nil
}

func encode(e sarama.Encoder) ([]byte, error) {
	if e == nil {
		return nil, nil
	}
	return e.Encode()
}

// limit is what bounds a call: a duration and the setting it comes from,
// for errors.
type limit struct {
	d    time.Duration
	name string
}

func (l limit) String() string { return fmt.Sprintf("%v (%s)", l.d.Round(time.Millisecond), l.name) }

// bound returns the context of a call made with ctx: it ends at ctx's
// deadline or DeliveryTimeout, whichever is first (DefaultDeliveryTimeout
// when neither is set), when ctx ends, and when the publisher closes.
func (p *Publisher) bound(ctx context.Context) (context.Context, context.CancelFunc, limit) {
	return p.boundBy(ctx, limit{})
}

// boundBy is bound with a further limit of the caller's (none when
// extra.d is 0).
func (p *Publisher) boundBy(ctx context.Context, extra limit) (context.Context, context.CancelFunc, limit) {
	now := time.Now()
	lim, deadline := limit{}, time.Time{}
	if d, ok := ctx.Deadline(); ok {
		lim, deadline = limit{max(d.Sub(now), 0), "the call's deadline"}, d
	}
	for _, l := range []limit{{p.timeout, "DeliveryTimeout"}, extra} {
		if l.d > 0 && (deadline.IsZero() || now.Add(l.d).Before(deadline)) {
			lim, deadline = l, now.Add(l.d)
		}
	}
	if deadline.IsZero() {
		lim, deadline = limit{DefaultDeliveryTimeout, "DefaultDeliveryTimeout"}, now.Add(DefaultDeliveryTimeout)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	stop := context.AfterFunc(p.ctx, cancel)
	return ctx, func() { stop(); cancel() }, lim
}

// produce sends records, the first len(records) of msgs, and returns how
// many leading ones Kafka acknowledged and, when that is not all, why the
// next one failed.
func (p *Publisher) produce(ctx context.Context, topic string, msgs []*message.Message, records []*kgo.Record) (int, error) {
	if len(records) == 0 {
		return 0, nil
	}
	ctx, cancel, lim := p.bound(ctx)
	defer cancel()
	index := make(map[*kgo.Record]int, len(records))
	for i, r := range records {
		// The record's own context cancels it; the produce context
		// stays open, so no record is dropped before it is buffered
		// while a later one is taken.
		r.Context = ctx
		index[r] = i
	}
	errs := make([]error, len(records))
	for _, res := range p.client.ProduceSync(context.Background(), records...) {
		errs[index[res.Record]] = res.Err
	}
	delivered := 0
	for delivered < len(errs) && errs[delivered] == nil {
		delivered++
	}
	if delivered == len(errs) {
		return delivered, nil
	}
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	m := msgs[delivered]
	return delivered, fmt.Errorf("millbox: kafkabatch: %d of %d messages to %s not acknowledged, first %s: %w",
		failed, len(records), topic, m.UUID, p.classify(ctx, lim, errs[delivered]))
}

// classify tells a broker failure from a message failure; ctx is the
// call's, bounded by lim.
func (p *Publisher) classify(ctx context.Context, lim limit, err error) error {
	switch {
	case p.ctx.Err() != nil || errors.Is(err, kgo.ErrClientClosed):
		return fmt.Errorf("%w: %w", destination.ErrClosed, err)
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave the call up: nothing to say about the broker.
		return fmt.Errorf("the call's context was cancelled: %w", err)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrRecordTimeout):
		// A bare deadline: say what the connection went through.
		return destination.DestinationUnavailable(fmt.Errorf("no acknowledgement within %v: %s (%w)", lim, p.conns.describe(), err))
	case ctx.Err() != nil:
		// kgo fails a record it kept retrying with the last error.
		return destination.DestinationUnavailable(fmt.Errorf("no acknowledgement within %v: %s: %w", lim, what(err), err))
	case brokerFailure(err):
		return destination.DestinationUnavailable(fmt.Errorf("%s: %w", what(err), err))
	}
	return err
}

// what names a broker failure.
func what(err error) string {
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		return "broker unreachable"
	case errors.As(err, &op), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return "connection to the broker lost"
	}
	return "broker failure"
}

// brokerFailure reports errors that every message would get until the
// broker is back: network errors and Kafka's retriable errors, except a
// missing topic, which is about the topic.
func brokerFailure(err error) bool {
	if errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID) {
		return false
	}
	var ne net.Error
	return kerr.IsRetriable(err) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, kgo.ErrRecordRetries)
}

// Close fails the calls in flight and closes the client.
func (p *Publisher) Close() error {
	p.cancel()
	p.client.Close()
	return nil
}

// connState remembers the last connection failure, so that a call that
// timed out can say why.
type connState struct {
	mu   sync.Mutex
	last string
}

var (
	_ kgo.HookBrokerConnect    = (*connState)(nil)
	_ kgo.HookBrokerDisconnect = (*connState)(nil)
	_ kgo.HookBrokerRead       = (*connState)(nil)
)

func (c *connState) set(s string) {
	c.mu.Lock()
	c.last = s
	c.mu.Unlock()
}

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (c *connState) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		c.set(fmt.Sprintf("broker %s:%d unreachable: %v", meta.Host, meta.Port, err))
		return
	}
	c.set("")
}

// OnBrokerDisconnect implements kgo.HookBrokerDisconnect.
func (c *connState) OnBrokerDisconnect(meta kgo.BrokerMetadata, _ net.Conn) {
	c.mu.Lock()
	if c.last == "" {
		c.last = fmt.Sprintf("connection to broker %s:%d lost", meta.Host, meta.Port)
	}
	c.mu.Unlock()
}

// OnBrokerRead implements kgo.HookBrokerRead.
func (c *connState) OnBrokerRead(meta kgo.BrokerMetadata, _ int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		c.set(fmt.Sprintf("connection to broker %s:%d lost: %v", meta.Host, meta.Port, err))
	}
}

func (c *connState) describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == "" {
		return "broker connected but not answering"
	}
	return c.last
}
