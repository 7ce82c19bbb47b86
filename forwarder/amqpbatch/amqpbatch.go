package amqpbatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/millbox/millbox/forwarder/destination"
)

// DefaultChannels is the size of the channel pool.
const DefaultChannels = 64

// DefaultConfirmTimeout bounds a call whose context has no deadline, when
// Config.ConfirmTimeout is not set.
const DefaultConfirmTimeout = 30 * time.Second

// dialTimeout bounds connecting to the broker when the call's time does not
// end sooner: amqp091-go's default.
const dialTimeout = 30 * time.Second

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
	// ConfirmTimeout bounds one call when it ends before the call's own
	// deadline, the deadline of the first message's context
	// (msgs[0].Context()), which the forwarder sets at its PublishTimeout
	// so that a call gives up when the forwarder does. A call waits that
	// long for a free channel, a connection and the broker's
	// confirmations; the messages not confirmed by then fail with an error
	// that wraps destination.ErrDestinationUnavailable and names the
	// limit. Defaults to 0: the call's deadline alone, and
	// DefaultConfirmTimeout for a call whose context has none.
	ConfirmTimeout time.Duration
	// ConfirmEach publishes each message of a call only after the broker
	// confirmed the previous one, so that a rejected message (nack) is
	// never followed by an accepted later one of its key. It costs one
	// round trip per message; turn it on when queues can reject some
	// publishes and accept later ones, as a length-limited queue with
	// x-overflow reject-publish does (see the package doc). Defaults to
	// false: a call's messages are published back to back.
	ConfirmEach bool
}

// Publisher publishes each call's messages on one channel with one wait
// for their confirmations.
type Publisher struct {
	cfg Config

	mu     sync.Mutex
	conn   *amqp.Connection
	idle   []*channel
	closed bool
	slots  chan struct{}
}

var _ message.Publisher = (*Publisher)(nil)

// channel is a confirm-mode channel and what made it close.
type channel struct {
	conn   *amqp.Connection
	ch     *amqp.Channel
	closes chan *amqp.Error
	err    *amqp.Error // the close reason, once received
}

// closeReason returns why the channel closed, or nil while it is open.
func (c *channel) closeReason() error {
	if !c.ch.IsClosed() {
		return nil
	}
	if c.err == nil {
		select {
		case e, ok := <-c.closes:
			if ok && e != nil {
				c.err = e
			}
		default:
		}
	}
	if c.err == nil {
		return amqp.ErrClosed
	}
	return c.err
}

// NewPublisher validates cfg and connects.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("%w: amqpbatch.Config.URL is required", destination.ErrInvalidConfig)
	}
	if cfg.Channels < 0 {
		return nil, fmt.Errorf("%w: amqpbatch.Config.Channels must not be negative", destination.ErrInvalidConfig)
	}
	if cfg.ConfirmTimeout < 0 {
		return nil, fmt.Errorf("%w: amqpbatch.Config.ConfirmTimeout must not be negative", destination.ErrInvalidConfig)
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
	p := &Publisher{cfg: cfg, slots: make(chan struct{}, cfg.Channels)}
	p.mu.Lock()
	_, err := p.connection(time.Time{})
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return p, nil
}

// connection returns the open connection, dialing a new one if the last
// one closed; connecting ends by deadline (none when zero). p.mu must be
// held.
func (p *Publisher) connection(deadline time.Time) (*amqp.Connection, error) {
	if p.conn != nil && !p.conn.IsClosed() {
		return p.conn, nil
	}
	p.idle = nil // channels of a closed connection are closed too
	timeout := dialTimeout
	if uri, err := amqp.ParseURI(p.cfg.URL); err == nil && uri.ConnectionTimeout > 0 {
		timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
	}
	if !deadline.IsZero() {
		timeout = max(min(timeout, time.Until(deadline)), time.Millisecond)
	}
	// amqp.Dial's settings, with the dial and handshake bounded by the
	// call's time.
	conn, err := amqp.DialConfig(p.cfg.URL, amqp.Config{Locale: "en_US", Dial: amqp.DefaultDial(timeout)})
	if err != nil {
		return nil, fmt.Errorf("millbox: amqpbatch: %w", destination.DestinationUnavailable(fmt.Errorf("broker unreachable: %w", err)))
	}
	p.conn = conn
	return conn, nil
}

// channel takes an idle confirm-mode channel or opens one, within the
// call's time (ctx, bounded by lim).
func (p *Publisher) channel(ctx context.Context, lim limit) (*channel, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("millbox: amqpbatch: %w", destination.ErrClosed)
	}
	for len(p.idle) > 0 {
		c := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if !c.ch.IsClosed() {
			p.mu.Unlock()
			return c, nil
		}
	}
	deadline, _ := ctx.Deadline()
	conn, err := p.connection(deadline)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// Opening a channel waits for the broker's answer with no timeout of
	// its own: wait for it only as long as the call may take. A channel
	// opened after that is closed.
	type opened struct {
		ch  *amqp.Channel
		err error
	}
	done := make(chan opened, 1)
	go func() {
		ch, err := conn.Channel()
		if err == nil {
			if err = ch.Confirm(false); err != nil {
				_ = ch.Close()
			}
		}
		done <- opened{ch, err}
	}()
	var o opened
	select {
	case o = <-done:
	case <-ctx.Done():
		go func() {
			if o := <-done; o.err == nil {
				_ = o.ch.Close()
			}
		}()
		return nil, fmt.Errorf("millbox: amqpbatch: open a confirm-mode channel: %w", p.late(ctx, lim, ctx.Err()))
	}
	if o.err != nil {
		if conn.IsClosed() {
			return nil, fmt.Errorf("millbox: amqpbatch: %w", destination.DestinationUnavailable(fmt.Errorf("connection to the broker lost while opening a channel: %w", o.err)))
		}
		return nil, fmt.Errorf("millbox: amqpbatch: open a confirm-mode channel: %w", o.err)
	}
	return &channel{conn: conn, ch: o.ch, closes: o.ch.NotifyClose(make(chan *amqp.Error, 1))}, nil
}

// release puts c back in the pool, or closes it when it cannot serve
// another call.
func (p *Publisher) release(c *channel, healthy bool) {
	p.mu.Lock()
	if healthy && !p.closed && !c.ch.IsClosed() && c.conn == p.conn {
		p.idle = append(p.idle, c)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	// Closing a channel waits for the broker's answer, which a broker
	// that stopped answering does not give: the call does not wait for
	// it. Closing the connection ends the wait.
	go func() { _ = c.ch.Close() }()
}

// Publish publishes msgs to topic on one channel, in order, and waits for
// the broker's confirmations, until the deadline of the first message's
// context (the forwarder's PublishTimeout) or Config.ConfirmTimeout,
// whichever ends first.
//
// It returns nil when the broker confirmed every message. Otherwise it
// returns a *destination.PartialError when a prefix of msgs was confirmed
// (acked), or a plain error when none was. Failures of the broker rather
// than of a message (unreachable, connection lost, no confirmation in
// time) wrap destination.ErrDestinationUnavailable; a rejection (nack)
// does not. The package doc says when a message after a rejected one can
// have been accepted, and how the error says so.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	ctx, cancel, lim := p.bound(msgs[0].Context())
	defer cancel()
	select {
	case p.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("millbox: amqpbatch: no channel free for a call to %s: %w", topic, p.late(ctx, lim, ctx.Err()))
	}
	defer func() { <-p.slots }()
	c, err := p.channel(ctx, lim)
	if err != nil {
		return err
	}
	res := p.publish(ctx, lim, c, topic, msgs)
	p.release(c, res.healthy)
	if res.delivered == len(msgs) {
		return nil
	}
	err = fmt.Errorf("millbox: amqpbatch: %d of %d messages to %s confirmed, then message %s: %w",
		res.delivered, len(msgs), topic, msgs[res.delivered].UUID, res.err)
	if res.delivered == 0 {
		return err
	}
	return &destination.PartialError{Delivered: res.delivered, Err: err}
}

// outcome is what became of a call's messages.
type outcome struct {
	delivered int   // leading messages the broker confirmed
	err       error // why message delivered failed
	healthy   bool  // the channel can serve another call
}

// limit is what bounds a call: a duration and the setting it comes from,
// for errors.
type limit struct {
	d    time.Duration
	name string
}

func (l limit) String() string { return fmt.Sprintf("%v (%s)", l.d.Round(time.Millisecond), l.name) }

// bound returns the context of a call made with ctx: it ends at ctx's
// deadline or ConfirmTimeout, whichever is first (DefaultConfirmTimeout
// when neither is set), and when ctx ends.
func (p *Publisher) bound(ctx context.Context) (context.Context, context.CancelFunc, limit) {
	now := time.Now()
	if d, ok := ctx.Deadline(); ok && (p.cfg.ConfirmTimeout == 0 || d.Before(now.Add(p.cfg.ConfirmTimeout))) {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, limit{max(d.Sub(now), 0), "the call's deadline"}
	}
	lim := limit{p.cfg.ConfirmTimeout, "ConfirmTimeout"}
	if lim.d == 0 {
		lim = limit{DefaultConfirmTimeout, "DefaultConfirmTimeout"}
	}
	ctx, cancel := context.WithTimeout(ctx, lim.d)
	return ctx, cancel, lim
}

// late describes a call whose context ended: the broker did not answer
// within lim, or the caller gave the call up.
func (p *Publisher) late(ctx context.Context, lim limit, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("the call's context was cancelled: %w", err)
	}
	return destination.DestinationUnavailable(fmt.Errorf("no answer within %v: broker not answering (%w)", lim, err))
}

func (p *Publisher) publish(ctx context.Context, lim limit, c *channel, topic string, msgs []*message.Message) outcome {
	exchange, key := p.cfg.Exchange(topic), p.cfg.RoutingKey(topic)
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	var stop error // a message that cannot be published ends the call before it
	for i, m := range msgs {
		pub, err := p.cfg.Marshaler.Marshal(m)
		if err != nil {
			stop = fmt.Errorf("marshal: %w", err)
			break
		}
		dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, pub)
		switch {
		case err != nil && ctx.Err() != nil:
			stop = p.late(ctx, lim, err)
		case err != nil:
			stop = p.lost(c, err, "publishing it")
		}
		if stop != nil {
			break
		}
		confirms = append(confirms, dc)
		if p.cfg.ConfirmEach {
			if out, ok := p.wait(ctx, lim, c, confirms, i); !ok {
				return out
			}
		}
	}
	out, ok := p.wait(ctx, lim, c, confirms, 0)
	if ok && stop != nil {
		out.err = stop
	}
	return out
}

// wait collects confirms from index from on, until ctx, bounded by lim,
// ends. It reports whether all of them, and the ones before from, were
// acks.
func (p *Publisher) wait(ctx context.Context, lim limit, c *channel, confirms []*amqp.DeferredConfirmation, from int) (outcome, bool) {
	out := outcome{delivered: from, healthy: true}
	first := -1 // the first message not acked
	later := 0  // messages acked after it
	for i := from; i < len(confirms); i++ {
		acked, err := confirms[i].WaitContext(ctx)
		if err != nil {
			// The channel may still deliver this confirmation; give
			// it up rather than let a later call wait for it.
			out.healthy = false
			if first < 0 {
				first = i
				out.err = p.late(ctx, lim, err)
			}
			break
		}
		switch {
		case acked && first < 0:
			out.delivered = i + 1
		case acked:
			later++
		case first < 0:
			first = i
			if reason := c.closeReason(); reason != nil {
				out.healthy = false
				out.err = p.lost(c, reason, "it was confirmed")
			} else {
				out.err = errors.New("broker rejected it (nack)")
			}
		}
	}
	if later > 0 {
		// Accepted after an earlier message of the call was not: the
		// queue holds them ahead of it.
		out.err = fmt.Errorf("%w; %d later messages of the call were accepted after it, so the queue holds them ahead of it, and publishing again from it repeats them after it", out.err, later)
	}
	return out, first < 0
}

// lost describes a channel that failed under a call: a lost connection
// is the broker's failure, a channel closed by the broker (an unknown
// exchange, a refused permission) the message's.
func (p *Publisher) lost(c *channel, err error, when string) error {
	if reason := c.closeReason(); reason != nil {
		err = reason
	}
	if c.conn.IsClosed() || connectionFailure(err) {
		return destination.DestinationUnavailable(fmt.Errorf("connection to the broker lost before %s: %w", when, err))
	}
	return fmt.Errorf("channel failed before %s: %w", when, err)
}

// connectionFailure reports errors of the connection rather than of the
// channel, seen before the client marked the connection closed: network
// errors, and the broker closing the connection (connection-forced on
// shutdown, a frame error, an internal error).
func connectionFailure(err error) bool {
	var ne net.Error
	var ae *amqp.Error
	switch {
	case errors.As(err, &ne), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	case errors.As(err, &ae):
		return ae.Code == amqp.ConnectionForced || ae.Code == amqp.FrameError || ae.Code == amqp.InternalError
	}
	return false
}

// Close closes the channels and the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	for _, c := range p.idle {
		_ = c.ch.Close()
	}
	p.idle = nil
	if p.conn != nil {
		return p.conn.Close()
	}
	return nil
}
