package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/emit"
	"github.com/millbox/millbox/forwarder/internal/wake"
	"github.com/millbox/millbox/forwarder/telemetry"
	"github.com/millbox/millbox/sqladapters"
)

const (
	// DefaultKeyMetadataField is the metadata field whose value becomes the
	// ordering key: destination.KeyMetadataField, in which the forwarder
	// hands each message's key to the destination.
	DefaultKeyMetadataField = destination.KeyMetadataField
	// DefaultSlot is PublisherConfig.Slot's default: cdc.DefaultSlot.
	DefaultSlot = "millbox_cdc"
	// DefaultMaxPayloadBytes is the largest payload the publisher accepts,
	// unless the dialect's MaxMessageBytes is lower.
	DefaultMaxPayloadBytes = 8 << 20
	// MaxMessageBytesWithoutTable is the largest message a publisher with
	// PublisherConfig.WithoutTable writes, counting its UUID, payload,
	// metadata (as JSON, the trace context included) and ordering key.
	// The forwarder holds a whole logical decoding message in memory while
	// it decodes it, and PostgreSQL bounds one WAL record to about 1 GB:
	// 32 MiB keeps both far away, and is four times DefaultMaxPayloadBytes.
	MaxMessageBytesWithoutTable = 32 << 20
	// emitRecordBytes bounds one logical decoding message of a Publish
	// call without a table: a larger call is written as several, in
	// order, in the same transaction.
	emitRecordBytes = 64 << 20
)

var (
	// ErrNoTx is returned when Publish finds no transaction. millbox never
	// falls back to autocommit.
	ErrNoTx = sqladapters.ErrNoTx
	// ErrInvalidMessage (destination.ErrInvalidMessage) is returned for a
	// message the outbox cannot store
	// faithfully: nil, without UUID, with a topic, UUID or metadata that is
	// not valid UTF-8 or holds a NUL byte, with a payload larger than
	// MaxPayloadBytes, or larger as a whole than the dialect's
	// MaxMessageBytes (sqladapters.Dialect), or, without a table, than
	// MaxMessageBytesWithoutTable, or with a delay field that cannot be
	// read (DelayedUntilMetadataField, DelayedForMetadataField). The error
	// names the field and the limit or the value. Publish checks every
	// message of a call before it writes any, so the caller's transaction
	// stays usable.
	ErrInvalidMessage = destination.ErrInvalidMessage
	// ErrInvalidConfig is returned by NewPublisher and
	// NewContextPublisher for a bad config.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
	// ErrClosed is returned by a closed publisher.
	ErrClosed = destination.ErrClosed
)

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Dialect describes the database and the outbox table. Required.
	Dialect sqladapters.Dialect
	// KeyMetadataField names the metadata field holding the ordering key.
	// Messages with the same key are forwarded in order; a message
	// without the field is not ordered relative to others. The key is
	// stored with the row, and the forwarder hands it to the destination
	// in destination.KeyMetadataField whatever this field is, so a Kafka
	// publisher keys its records by it. Defaults to
	// DefaultKeyMetadataField.
	KeyMetadataField string
	// OrderingKey, when set, derives each message's ordering key from the
	// message, for producers that cannot set metadata themselves (a
	// cqrs.EventBus, a library's publisher): for example the aggregate id
	// read from the payload or from metadata set elsewhere. The key is
	// stored in the KeyMetadataField metadata of the message, as if the
	// producer had set it. An empty result leaves the message as it is.
	OrderingKey func(topic string, msg *message.Message) string
	// MaxPayloadBytes rejects larger payloads at write time, instead of
	// letting the broker reject them later. Defaults to
	// DefaultMaxPayloadBytes; a negative value disables the check. It
	// cannot raise what the database stores: the dialect's
	// MaxMessageBytes bounds every message, payload included, whatever
	// this value is (on MySQL/MariaDB half the server's
	// max_allowed_packet).
	MaxPayloadBytes int
	// WithoutTable writes each Publish call's messages into PostgreSQL's
	// write-ahead log as one logical decoding message
	// (pg_logical_emit_message), in the caller's transaction, instead of
	// rows of the outbox table: no row, no index entry, no delete and no
	// vacuum for a message that goes out at its first attempt. The change
	// data capture source (forwarder/cdc) decodes them from the stream in
	// commit order, with the same lanes, breaker and at-least-once promise,
	// and writes a message whose delivery fails into the outbox table,
	// where its retries, dead letter and requeue take the ordinary path.
	// Publishers with and without a table may share one outbox and one
	// forwarder; a key keeps its order across both.
	//
	// It needs PostgreSQL 14 or later with wal_level logical (Publish
	// refuses elsewhere, writing nothing: sqladapters.ErrEmitUnavailable),
	// and a forwarder with the cdc source on the outbox. Where that
	// forwarder's replication slot (Slot) does not exist at the moment of
	// the call (it was not created yet, or a standby was promoted and the
	// forwarder has not created its slot there yet), no forwarder could read the
	// messages: Publish writes them into the outbox table instead, in the
	// same transaction, and the forwarder reads them from there. Messages
	// are held only by the WAL until the slot confirms them: a slot
	// dropped, invalidated (max_slot_wal_keep_size) or lost with its
	// server before it did loses them, which a table would not; see
	// forwarder/cdc's documentation for the guardrails.
	// Messages are at most MaxMessageBytesWithoutTable. Delayed messages
	// are written into the outbox's table of scheduled messages, which
	// must exist, and reach the forwarder as rows of the outbox once due.
	// Defaults to false.
	WithoutTable bool
	// Slot is, with WithoutTable, the logical replication slot of the
	// forwarder that reads this outbox (cdc.Source.Slot): a call is
	// written without a table only while that slot exists and can decode
	// it, and into the table otherwise. Another outbox's slot, or another
	// tool's, never counts: after a failover it would take messages that
	// no forwarder of this outbox reads. Defaults to DefaultSlot, as
	// cdc.Source's; "*" accepts any logical slot of the database.
	Slot string
	// Telemetry.Propagator stores the trace context of each message's
	// context (msg.SetContext) in its metadata, so that the trace of the
	// request that wrote the message continues where it is sent and
	// consumed. A message whose context carries no span keeps its
	// metadata as it is. The publisher records no metrics or spans of its
	// own. Defaults to DefaultPropagator().
	Telemetry telemetry.Config
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *PublisherConfig) setDefaults() {
	c.KeyMetadataField = cmp.Or(c.KeyMetadataField, DefaultKeyMetadataField)
	c.MaxPayloadBytes = cmp.Or(c.MaxPayloadBytes, DefaultMaxPayloadBytes)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
	if c.Telemetry.Propagator == nil {
		c.Telemetry.Propagator = telemetry.DefaultPropagator()
	}
}

// Validate names the first invalid field.
func (c PublisherConfig) Validate() error {
	if c.Dialect == nil {
		return fmt.Errorf("%w: PublisherConfig.Dialect is required (for example postgres.New(postgres.Options{}))", ErrInvalidConfig)
	}
	if c.WithoutTable && c.Dialect.Logical() == nil {
		return fmt.Errorf("%w: PublisherConfig.WithoutTable needs a database that streams its changes (PostgreSQL), not %s", ErrInvalidConfig, c.Dialect.Name())
	}
	if c.Slot != "" && c.Slot != "*" && !slotName.MatchString(c.Slot) {
		return fmt.Errorf("%w: PublisherConfig.Slot %q must be 1 to 63 lower case letters, digits and underscores (PostgreSQL's rule for slot names), or \"*\"", ErrInvalidConfig, c.Slot)
	}
	return nil
}

// Publisher writes messages into the outbox table inside a transaction (or,
// with PublisherConfig.WithoutTable, into the write-ahead log).
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
// ascending outbox ids. A message with a due time in the future (Watermill's
// delay metadata, DeliverAt) waits in the scheduled table until then (see
// the forwarder package doc, "Delayed messages"). Publishing no message is a no-op.
// A call that fails writes none of its messages.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	return p.publish(nil, nil, topic, msgs)
}

// PublishTx writes msgs to the outbox for topic in tx, whatever the
// publisher is bound to and whatever the messages' contexts carry: one
// call, with one publisher made at start, publishes in any transaction.
//
//	err = outbox.PublishTx(ctx, pgxv5.WrapTx(tx), "orders", msg)
//
// It is Publish otherwise: the same checks, order and all-or-nothing.
func (p *Publisher) PublishTx(ctx context.Context, tx sqladapters.Tx, topic string, msgs ...*message.Message) error {
	if tx == nil {
		return fmt.Errorf("%w: PublishTx needs a transaction", ErrNoTx)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	return p.publish(ctx, tx, topic, msgs)
}

// publish writes msgs in tx, or, when tx is nil, in the bound transaction
// or the one of the messages' context.
func (p *Publisher) publish(ctx context.Context, tx sqladapters.Tx, topic string, msgs []*message.Message) error {
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
	if strings.IndexByte(topic, 0) >= 0 {
		return fmt.Errorf("%w: topic %q contains a NUL byte, which Postgres cannot store in text", ErrInvalidMessage, topic)
	}
	telemetry.InjectTrace(p.cfg.Telemetry.Propagator, msgs)
	if p.cfg.OrderingKey != nil {
		for _, m := range msgs {
			if m == nil {
				continue
			}
			if key := p.cfg.OrderingKey(topic, m); key != "" {
				if m.Metadata == nil {
					m.Metadata = make(message.Metadata)
				}
				m.Metadata.Set(p.cfg.KeyMetadataField, key)
			}
		}
	}
	rows := make([]sqladapters.OutboxMessage, len(msgs))
	now := time.Now()
	var scheduled int
	var earliest time.Time
	for i, m := range msgs {
		row, err := p.toRow(topic, i, m, now)
		if err != nil {
			return err
		}
		rows[i] = row
		if !row.DueAt.IsZero() {
			scheduled++
			if earliest.IsZero() || row.DueAt.Before(earliest) {
				earliest = row.DueAt
			}
		}
	}
	if tx == nil {
		var err error
		if tx, ctx, err = p.txFor(msgs); err != nil {
			return err
		}
	}
	table := p.cfg.Dialect.OutboxTable()
	inTable := !p.cfg.WithoutTable
	if !inTable {
		err := p.emit(ctx, tx, rows, scheduled)
		switch {
		case errors.Is(err, sqladapters.ErrEmitNoSlot):
			// No slot could read them now, and nothing was written: the
			// table keeps them until a forwarder reads it.
			inTable = true
		case err != nil:
			return err
		}
	}
	if inTable {
		if err := p.cfg.Dialect.InsertOutbox(ctx, tx, rows); err != nil {
			return fmt.Errorf("millbox: write %d message(s) to the outbox: %w", len(msgs), err)
		}
		if scheduled < len(rows) {
			wake.Rows(table)
		}
	}
	if scheduled > 0 {
		wake.Due(table, earliest)
	}
	return nil
}

// emit writes the messages due now into the write-ahead log, and the
// scheduled ones into the scheduled table: they wait there for their time
// as those of a publisher with a table do, and reach the forwarder as
// rows of the outbox. The log comes first, because its check (a slot must
// exist) refuses the call before anything is written. A failed insert of
// the scheduled ones then aborts the transaction, as any failed statement
// does on PostgreSQL, unless the insert took several statements (more
// than 5,000 scheduled messages), which run under a savepoint: then the
// logged messages stay in the transaction, and the caller must roll it
// back as the error says.
func (p *Publisher) emit(ctx context.Context, tx sqladapters.Tx, rows []sqladapters.OutboxMessage, scheduled int) error {
	now := rows
	if scheduled > 0 {
		now = make([]sqladapters.OutboxMessage, 0, len(rows)-scheduled)
		for _, r := range rows {
			if r.DueAt.IsZero() {
				now = append(now, r)
			}
		}
	}
	if len(now) > 0 {
		runs := emit.Split(now, emitRecordBytes)
		records := make([]sqladapters.EmitRecord, len(runs))
		for i, run := range runs {
			records[i] = sqladapters.EmitRecord{Content: emit.Encode(run), Messages: len(run), Slot: p.slot()}
		}
		if err := p.cfg.Dialect.Logical().Emit(ctx, tx, records); err != nil {
			return fmt.Errorf("millbox: write %d message(s) to the outbox without a table: %w", len(now), err)
		}
	}
	if scheduled == 0 {
		return nil
	}
	later := make([]sqladapters.OutboxMessage, 0, scheduled)
	for _, r := range rows {
		if !r.DueAt.IsZero() {
			later = append(later, r)
		}
	}
	if err := p.cfg.Dialect.InsertOutbox(ctx, tx, later); err != nil {
		if len(now) > 0 {
			return fmt.Errorf("millbox: write %d scheduled message(s) to the outbox's scheduled table (roll the transaction back: it holds the call's %d other message(s)): %w", len(later), len(now), err)
		}
		return fmt.Errorf("millbox: write %d scheduled message(s) to the outbox's scheduled table: %w", len(later), err)
	}
	return nil
}

// slotName is PostgreSQL's rule for replication slot names.
var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// slot is the replication slot a call without a table needs, "" for any.
func (p *Publisher) slot() string {
	switch p.cfg.Slot {
	case "":
		return DefaultSlot
	case "*":
		return ""
	}
	return p.cfg.Slot
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

func (p *Publisher) toRow(topic string, i int, m *message.Message, now time.Time) (sqladapters.OutboxMessage, error) {
	if m == nil {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d is nil", ErrInvalidMessage, i)
	}
	if m.UUID == "" {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d has an empty UUID", ErrInvalidMessage, i)
	}
	if !utf8.ValidString(m.UUID) {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d: UUID %q is not valid UTF-8", ErrInvalidMessage, i, m.UUID)
	}
	if strings.IndexByte(m.UUID, 0) >= 0 {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %d: UUID %q contains a NUL byte, which Postgres cannot store in text", ErrInvalidMessage, i, m.UUID)
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
		// JSON would carry a NUL as \u0000, which Postgres' jsonb and
		// text refuse; refuse it on every database alike.
		if strings.IndexByte(k, 0) >= 0 {
			return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: metadata key %q contains a NUL byte", ErrInvalidMessage, m.UUID, k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			if k == p.cfg.KeyMetadataField {
				return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: ordering key (metadata %q) contains a NUL byte", ErrInvalidMessage, m.UUID, k)
			}
			return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: metadata %q value contains a NUL byte", ErrInvalidMessage, m.UUID, k)
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
	size := len(topic) + len(m.UUID) + len(payload) + len(md) + len(key)
	if limit := p.cfg.Dialect.MaxMessageBytes(); limit > 0 && size > limit {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: %d bytes (payload %d, metadata %d, ordering key %d, topic and UUID %d) exceed the %s dialect's MaxMessageBytes %d",
			ErrInvalidMessage, m.UUID, size, len(payload), len(md), len(key), len(topic)+len(m.UUID), p.cfg.Dialect.Name(), limit)
	}
	if size -= len(topic); p.cfg.WithoutTable && size > MaxMessageBytesWithoutTable {
		return sqladapters.OutboxMessage{}, fmt.Errorf("%w: message %s: %d bytes (payload %d, metadata %d, ordering key %d, UUID %d) exceed MaxMessageBytesWithoutTable %d",
			ErrInvalidMessage, m.UUID, size, len(payload), len(md), len(key), len(m.UUID), MaxMessageBytesWithoutTable)
	}
	due, err := dueAt(m, now)
	if err != nil {
		return sqladapters.OutboxMessage{}, err
	}
	// Rows without a key spread over the partitions by their UUID.
	hash := KeyHash(key)
	if key == "" {
		hash = KeyHash(m.UUID)
	}
	return sqladapters.OutboxMessage{
		Topic:    topic,
		UUID:     m.UUID,
		Payload:  payload,
		Metadata: md,
		Key:      key,
		KeyHash:  hash,
		DueAt:    due,
	}, nil
}

// KeyHash places a key in a forwarder partition: FNV-1a of the key, in 31
// bits. It depends on the key alone, so every instance of every version
// agrees; KeyHash("") is FNV-1a of no bytes, 18652613. The publisher
// places a message without a key by KeyHash of its UUID instead, which
// spreads such messages over the partitions.
//
// The dialects index this hash, not the key, wherever they look rows up by
// key, and compare the full keys of the rows they find, so keys of any
// length work and two keys sharing a hash never hold each other back.
func KeyHash(key string) int32 {
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
