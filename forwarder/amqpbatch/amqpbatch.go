package amqpbatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/millbox/millbox/sqladapters"
)

// DefaultChannels is the size of the channel pool.
const DefaultChannels = 64

// DefaultConfirmTimeout bounds the wait for a call's confirmations.
const DefaultConfirmTimeout = 30 * time.Second

// Config configures a Publisher.
type Config struct {
	// URL of the broker. Required.
	URL string
	// Marshaler turns messages into AMQP publishings. Defaults to
	// watermill-amqp's DefaultMarshaler (persistent delivery mode).
	Marshaler wamqp.Marshaler
	// Exchange returns the exchange for a topic. Defaults to the default
	// exchange ("").
	Exchange func(topic string) string
	// RoutingKey returns the routing key for a topic. Defaults to the
	// topic.
	RoutingKey func(topic string) string
	// Channels is the number of channels in confirm mode kept open.
	// Defaults to DefaultChannels.
	Channels int
	// ConfirmTimeout bounds the wait for confirmations. Defaults to
	// DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
}

// Publisher publishes each call's messages with one wait for their
// confirmations.
type Publisher struct {
	cfg Config

	mu     sync.Mutex
	conn   *amqp.Connection
	idle   []*amqp.Channel
	closed bool
	slots  chan struct{}
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg and connects.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: amqpbatch.Config.URL is required", sqladapters.ErrInvalidConfig)
	}
	if cfg.Channels < 0 {
		return nil, fmt.Errorf("%w: amqpbatch.Config.Channels must not be negative", sqladapters.ErrInvalidConfig)
	}
	if cfg.Marshaler == nil {
		cfg.Marshaler = wamqp.DefaultMarshaler{}
	}
	if cfg.Exchange == nil {
		cfg.Exchange = func(string) string { return "" }
	}
	if cfg.RoutingKey == nil {
		cfg.RoutingKey = func(topic string) string { return topic }
	}
	if cfg.Channels == 0 {
		cfg.Channels = DefaultChannels
	}
	if cfg.ConfirmTimeout <= 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	p := &Publisher{cfg: cfg, slots: make(chan struct{}, cfg.Channels)}
	p.mu.Lock()
	_, err := p.connection()
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return p, nil
}

// connection returns the open connection, dialing a new one if the last
// one closed. p.mu must be held.
func (p *Publisher) connection() (*amqp.Connection, error) {
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, nil
	}
	p.idle = nil // channels of a closed connection are closed too
	conn, err := amqp.Dial(p.cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("millbox: amqpbatch: connect: %w", err)
	}
	p.conn = conn
	return conn, nil
}

// channel takes an idle confirm-mode channel or opens one.
func (p *Publisher) channel() (*amqp.Channel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("millbox: amqpbatch: publisher closed")
	}
	for len(p.idle) > 0 {
		ch := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !ch.IsClosed() {
			return ch, nil
		}
	}
	conn, err := p.connection()
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("millbox: amqpbatch: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("millbox: amqpbatch: confirm mode: %w", err)
	}
	return ch, nil
}

func (p *Publisher) release(ch *amqp.Channel, healthy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if healthy && !p.closed && !ch.IsClosed() {
		p.idle = append(p.idle, ch)
		return
	}
	_ = ch.Close()
}

// Publish publishes msgs to topic on one channel, in order, and returns
// once the broker confirmed all of them. An error means some may have been
// routed: publish them again (at least once).
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	p.slots <- struct{}{}
	defer func() { <-p.slots }()
	ch, err := p.channel()
	if err != nil {
		return err
	}
	healthy := false
	defer func() { p.release(ch, healthy) }()

	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ConfirmTimeout)
	defer cancel()
	exchange, key := p.cfg.Exchange(topic), p.cfg.RoutingKey(topic)
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		pub, err := p.cfg.Marshaler.Marshal(m)
		if err != nil {
			healthy = true
			return fmt.Errorf("millbox: amqpbatch: marshal message %s: %w", m.UUID, err)
		}
		if confirms[i], err = ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, pub); err != nil {
			return fmt.Errorf("millbox: amqpbatch: publish message %s to %s: %w", m.UUID, topic, err)
		}
	}
	for i, c := range confirms {
		acked, err := c.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("millbox: amqpbatch: confirmation of message %s: %w", msgs[i].UUID, err)
		}
		if !acked {
			healthy = true
			return fmt.Errorf("millbox: amqpbatch: broker rejected message %s (nack)", msgs[i].UUID)
		}
	}
	healthy = true
	return nil
}

// Close closes the channels and the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, ch := range p.idle {
		_ = ch.Close()
	}
	p.idle = nil
	if p.conn != nil {
		return p.conn.Close()
	}
	return nil
}
