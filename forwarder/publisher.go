package forwarder

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync/atomic"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/sqladapters"
)

const (
	// DefaultKeyMetadataField is the metadata field whose value becomes the
	// ordering key. The same field works with watermill-kafka's
	// partitioning marshaler, so the key also becomes the Kafka message key.
	DefaultKeyMetadataField = "partition_key"
	// DefaultMaxPayloadBytes is the largest payload the publisher accepts.
	DefaultMaxPayloadBytes = 8 << 20
)

var (
	// ErrNoTx is returned when Publish finds no transaction. millbox never
	// falls back to autocommit.
	ErrNoTx = sqladapters.ErrNoTx
	// ErrInvalidMessage is returned for a message the outbox cannot store
	// faithfully: nil, without UUID, with invalid UTF-8 metadata, or
	// larger than MaxPayloadBytes.
	ErrInvalidMessage = errors.New("millbox: invalid message")
	// ErrInvalidConfig is returned by constructors for a bad config.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
	// ErrClosed is returned by a closed publisher or forwarder.
	ErrClosed = errors.New("millbox: closed")
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Dialect describes the database and the outbox table. Required.
	Dialect sqladapters.Dialect
	// KeyMetadataField names the metadata field holding the ordering key.
	// Messages with the same key are forwarded in order; a message
	// without the field is not ordered relative to others. Defaults to
	// DefaultKeyMetadataField.
	KeyMetadataField string
	// MaxPayloadBytes rejects larger payloads at write time, instead of
	// letting the broker reject them later. Defaults to
	// DefaultMaxPayloadBytes; a negative value disables the check.
	MaxPayloadBytes int
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *PublisherConfig) setDefaults() {
	c.KeyMetadataField = cmp.Or(c.KeyMetadataField, DefaultKeyMetadataField)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate names the first invalid field.
func (c PublisherConfig) Validate() error {
	if c.Dialect == nil {
		return fmt.Errorf("%w: PublisherConfig.Dialect is required (for example postgres.New(postgres.Options{}))", ErrInvalidConfig)
	}
	return nil
}

// Publisher writes messages into the outbox table inside a transaction.
// It implements message.Publisher. It is safe for concurrent use as far as
// its transaction is: a bound publisher shares the rules of its tx.
type Publisher struct {
	cfg    PublisherConfig
	tx     sqladapters.Tx // nil in context mode
	closed atomic.Bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher returns a publisher bound to tx: every Publish writes in tx,
// and the rows commit or roll back with it. Wrap the transaction you hold
// with pgxv5.WrapTx, stdsql.WrapTx or wmsql.WrapTx.
func NewPublisher(tx sqladapters.Tx, cfg PublisherConfig) (*Publisher, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: NewPublisher needs a transaction; use NewContextPublisher to take it from each message's context", ErrNoTx)
	}
	return newPublisher(tx, cfg)
}

// NewContextPublisher returns a long-lived publisher that takes the
// transaction from each message's context (msg.SetContext with a context
// made by sqladapters.WithTx; the inbox middleware does it for handlers).
// A message without one fails with ErrNoTx.
func NewContextPublisher(cfg PublisherConfig) (*Publisher, error) {
	return newPublisher(nil, cfg)
}

func newPublisher(tx sqladapters.Tx, cfg PublisherConfig) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Publisher{cfg: cfg, tx: tx}, nil
}

// Publish writes msgs to the outbox for topic, in one round trip per up to
// a few thousand messages. The messages keep their order: they get
// ascending outbox ids. Publishing no message is a no-op.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if p.closed.Load() {
		return ErrClosed
	}
	if len(msgs) == 0 {
		return nil
	}
	if topic == "" {
		return fmt.Errorf("%w: empty topic", ErrInvalidMessage)
	}
	if !utf8.ValidString(topic) {
		return fmt.Errorf("%w: topic %q is not valid UTF-8", ErrInvalidMessage, topic)
	}
	rows := make([]sqladapters.OutboxMessage, len(msgs))
	for i, m := range msgs {
		row, err := p.toRow(topic, i, m)
		if err != nil {
			return err
		}
		rows[i] = row
	}
	tx, ctx, err := p.txFor(msgs)
	if err != nil {
		return err
	}
	for _, q := range p.cfg.Dialect.InsertOutbox(rows) {
		if _, err := q.Exec(ctx, tx); err != nil {
			return fmt.Errorf("millbox: write %d message(s) to the outbox: %w", len(msgs), p.cfg.Dialect.ClassifyError(err))
		}
	}
	wake(p.cfg.Dialect.OutboxTable())
	return nil
}

// txFor returns the bound transaction, or the one in the messages' context.
func (p *Publisher) txFor(msgs []*message.Message) (sqladapters.Tx, context.Context, error) {
	ctx := msgs[0].Context()
	if p.tx != nil {
		return p.tx, ctx, nil
	}
	tx, err := sqladapters.TxFromContext(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("millbox: publish message %s: %w", msgs[0].UUID, err)
	}
	for _, m := range msgs[1:] {
		other, err := sqladapters.TxFromContext(m.Context())
		if err != nil || other != tx {
			return nil, nil, fmt.Errorf("%w: messages %s and %s of one Publish call carry different transactions", ErrInvalidMessage, msgs[0].UUID, m.UUID)
		}
	}
	return tx, ctx, nil
}

func (p *Publisher) toRow(topic string, i int, m *message.Message) (sqladapters.OutboxMessage, error) {
	if m == nil {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d is nil", ErrInvalidMessage, i)
	}
	if m.UUID == "" {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d has an empty UUID", ErrInvalidMessage, i)
	}
	if !utf8.ValidString(m.UUID) {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d: UUID %q is not valid UTF-8", ErrInvalidMessage, i, m.UUID)
	}
	if p.cfg.MaxPayloadBytes > 0 && len(m.Payload) > p.cfg.MaxPayloadBytes {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: payload of %d bytes exceeds MaxPayloadBytes %d",
			ErrInvalidMessage, m.UUID, len(m.Payload), p.cfg.MaxPayloadBytes)
	}
	// JSON would silently replace invalid UTF-8 with U+FFFD; refuse instead
	// of storing something other than what was published.
	for k, v := range m.Metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: metadata %q is not valid UTF-8", ErrInvalidMessage, m.UUID, k)
		}
	}
	md := []byte("{}")
	if len(m.Metadata) > 0 {
		var err error
		if md, err = json.Marshal(map[string]string(m.Metadata)); err != nil {
			return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: metadata: %w", ErrInvalidMessage, m.UUID, err)
		}
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	key := m.Metadata.Get(p.cfg.KeyMetadataField)
	return sqladapters.OutboxMessage{
		Topic:    topic,
		UUID:     m.UUID,
		Payload:  payload,
		Metadata: md,
		Key:      key,
		KeyHash:  KeyHash(key),
	}, nil
}

// KeyHash places a key in a forwarder partition: FNV-1a of the key, in 31
// bits. Rows without a key are spread at random.
func KeyHash(key string) int32 {
	if key == "" {
		return rand.Int32()
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return int32(h.Sum32() & 0x7fffffff)
}

// Close makes further Publish calls fail with ErrClosed. It does not touch
// the transaction, which belongs to the caller.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
