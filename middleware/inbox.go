package middleware

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/sqladapters"
)

// DefaultCommitTimeout bounds the commit of a handler's transaction. The
// commit runs without the message context's cancellation: once the handler
// has done its work, committing it is better than throwing it away because
// the router is shutting down.
const DefaultCommitTimeout = 30 * time.Second

var (
	// ErrInvalidConfig is returned by NewInbox for a bad config. The error
	// names the field and the rule.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
	// ErrNoMessageID is returned by the inbox middleware for a message
	// whose id cannot be determined (MessageID failed or returned an
	// invalid id). The handler does not run. Redelivery cannot fix it, so
	// route it to a poison queue (see the package documentation).
	ErrNoMessageID = errors.New("millbox: message has no usable id")
)

// InboxConfig configures the inbox middleware.
type InboxConfig struct {
	// DB begins the transaction each message is handled in. Required.
	DB sqladapters.DB
	// Dialect describes the database and the inbox table. Required.
	Dialect sqladapters.Dialect
	// Consumer names this consumer in the inbox key, for example the
	// service name. Required. Unless SharedAcrossHandlers is set, the
	// router handler name is appended (Consumer + "/" + handler name).
	Consumer string
	// SharedAcrossHandlers records Consumer alone, so every router handler
	// using this middleware shares one set of processed ids. Defaults to
	// false: each handler has its own (see the package documentation).
	SharedAcrossHandlers bool
	// MessageID returns the id that identifies a message across
	// redeliveries. Defaults to the Watermill UUID (UUIDID).
	MessageID func(*message.Message) (string, error)
	// TxOptions are the options of each message's transaction. Defaults
	// to the database's default isolation, read-write.
	TxOptions sql.TxOptions
	// CommitTimeout bounds each commit. Defaults to DefaultCommitTimeout.
	CommitTimeout time.Duration
	// OnDuplicate, when set, is called for each duplicate after its
	// transaction was rolled back and before it is acked: count
	// duplicates here (they are also logged at debug level). It runs on
	// the handler's goroutine and must be quick.
	OnDuplicate func(msg *message.Message)
	// Telemetry receives the middleware's metrics and process spans
	// (see Telemetry). Defaults to OpenTelemetry's global providers.
	Telemetry Telemetry
	// Logger defaults to watermill.NopLogger.
	Logger watermill.LoggerAdapter
}

func (c *InboxConfig) setDefaults() {
	if c.MessageID == nil {
		c.MessageID = UUIDID
	}
	c.CommitTimeout = cmp.Or(c.CommitTimeout, DefaultCommitTimeout)
	if c.Logger == nil {
		c.Logger = watermill.NopLogger{}
	}
}

// Validate names the first invalid field. Zero fields take their defaults
// first, as in NewInbox.
func (c InboxConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.DB == nil:
		return fmt.Errorf("%w: InboxConfig.DB is required (for example pgxv5.WrapPool(pool))", ErrInvalidConfig)
	case c.Dialect == nil:
		return fmt.Errorf("%w: InboxConfig.Dialect is required (for example postgres.New(postgres.Options{}))", ErrInvalidConfig)
	case c.TxOptions.ReadOnly:
		return fmt.Errorf("%w: InboxConfig.TxOptions.ReadOnly must be false: the inbox writes in the transaction", ErrInvalidConfig)
	case c.CommitTimeout < 0:
		return fmt.Errorf("%w: InboxConfig.CommitTimeout %v must not be negative", ErrInvalidConfig, c.CommitTimeout)
	}
	if err := inbox.ValidateKey("InboxConfig.Consumer", c.Consumer); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// UUIDID returns the Watermill UUID of msg, the default message id.
func UUIDID(msg *message.Message) (string, error) {
	if msg.UUID == "" {
		return "", errors.New("message UUID is empty")
	}
	return msg.UUID, nil
}

// MetadataID returns a MessageID function that reads the id from metadata
// field, for producers that put a stable id there (an idempotency key, a
// CloudEvents id). A message without the field, or with an empty value,
// fails with an error wrapping ErrNoMessageID.
func MetadataID(field string) func(*message.Message) (string, error) {
	return func(msg *message.Message) (string, error) {
		id := msg.Metadata.Get(field)
		if id == "" {
			return "", fmt.Errorf("metadata field %q is missing or empty", field)
		}
		return id, nil
	}
}

type inboxMiddleware struct {
	cfg InboxConfig
	ib  *inbox.Inbox
	tel *inboxTelemetry
}

// NewInbox returns the inbox middleware (see the package documentation).
// Add it after Retry, Recoverer and PoisonQueue, so that it runs closest
// to the handler.
func NewInbox(cfg InboxConfig) (message.HandlerMiddleware, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ib, err := inbox.New(inbox.Config{Dialect: cfg.Dialect})
	if err != nil {
		return nil, err
	}
	tel, err := newInboxTelemetry(cfg.Telemetry)
	if err != nil {
		return nil, err
	}
	m := &inboxMiddleware{cfg: cfg, ib: ib, tel: tel}
	return m.wrap, nil
}

func (m *inboxMiddleware) consumer(msg *message.Message) string {
	if m.cfg.SharedAcrossHandlers {
		return m.cfg.Consumer
	}
	if h := message.HandlerNameFromCtx(msg.Context()); h != "" {
		return m.cfg.Consumer + "/" + h
	}
	return m.cfg.Consumer
}

func (m *inboxMiddleware) messageID(msg *message.Message) (string, error) {
	id, err := m.cfg.MessageID(msg)
	if err == nil {
		err = inbox.ValidateKey("message id", id)
	}
	if err != nil {
		return "", fmt.Errorf("%w: message %s: %w", ErrNoMessageID, msg.UUID, err)
	}
	return id, nil
}

func (m *inboxMiddleware) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) (produced []*message.Message, err error) {
		orig := msg.Context()
		consumer := m.consumer(msg)
		// ctx carries the process span; the handler sees it with the tx.
		ctx, proc := m.tel.start(orig, msg, consumer)
		class := "" // error.type of the outcome; "" on success
		defer func() {
			if r := recover(); r != nil {
				proc.end(ctx, ErrorClassHandler, fmt.Errorf("handler panicked: %v", r))
				panic(r)
			}
			proc.end(ctx, class, err)
		}()

		id, err := m.messageID(msg)
		if err != nil {
			class = ErrorClassNoMessageID
			return nil, err
		}
		// The duplicate check runs before the handler, in the handler's
		// transaction; with pgx it goes out with the BEGIN.
		tx, first, err := m.ib.BeginRecord(ctx, m.cfg.DB, m.cfg.TxOptions, consumer, id)
		if err != nil {
			class = ErrorClassDatabase
			return nil, err
		}
		if !first {
			// BeginRecord has rolled the transaction back.
			proc.duplicate = true
			m.cfg.Logger.Debug("Duplicate message skipped by the inbox", watermill.LogFields{
				"consumer":     consumer,
				"message_id":   id,
				"message_uuid": msg.UUID,
			})
			if m.cfg.OnDuplicate != nil {
				m.cfg.OnDuplicate(msg)
			}
			return nil, nil
		}
		finished := false
		// Runs on every path, panics included: a transaction is never
		// left open, even when ctx was cancelled.
		defer func() {
			if !finished {
				sqladapters.Rollback(tx)
			}
		}()

		msg.SetContext(sqladapters.WithTx(ctx, tx))
		// Later middleware and the router see the message as it came: a
		// retry or a poison-queue publish must not find a finished tx.
		defer msg.SetContext(orig)

		produced, err = h(msg)
		if err != nil {
			class = ErrorClassHandler
			return nil, err
		}
		commitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CommitTimeout)
		defer cancel()
		if err := tx.Commit(commitCtx); err != nil {
			class = ErrorClassDatabase
			return nil, fmt.Errorf("millbox: inbox: commit message %q: %w", id, err)
		}
		finished = true
		return produced, nil
	}
}
