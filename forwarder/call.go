package forwarder

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/metadata"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// call is one Publish call: consecutive rows of one lane, in order.
type call struct {
	lane  *lane
	rows  []*source.Row
	probe bool // sent while the breaker is open, to see if the destination is back
	left  bool // its rows were given back to the source after it timed out

	mu    sync.Mutex
	state int // callRunning, callReturned or callTimedOut
}

const (
	callRunning = iota
	callReturned
	callTimedOut
)

// callEvent reports a call to the dispatcher. A call reports done, or
// timeout followed by late (in this order, through one channel).
type callEvent struct {
	c         *call
	kind      int  // eventDone, eventTimeout, eventLate
	delivered int  // leading rows the destination acknowledged
	partial   bool // the publisher said which rows got through
	err       error
	took      time.Duration
}

const (
	eventDone = iota
	eventTimeout
	eventLate
	eventTx // a lane's part of a transaction (txn.go)
)

// runCall publishes the call's rows and reports to events, unless the
// engine stopped meanwhile (quit): it does not wait for calls past
// PublishTimeout. It turns the rows into messages first: rows after the
// first one whose topic differs, or that cannot be turned into a message,
// are left for a later call.
func (f *Forwarder) runCall(c *call, events chan<- callEvent, quit <-chan struct{}) {
	msgs := make([]*message.Message, 0, len(c.rows))
	var topic string
	var prepErr error
	for i, r := range c.rows {
		o := f.prepare(r.OutboxRow)
		if o.err != nil {
			prepErr = o.err
			break
		}
		if i == 0 {
			topic = o.topic
		} else if o.topic != topic {
			break
		}
		msgs = append(msgs, o.msg)
	}
	ev := callEvent{c: c, kind: eventDone}
	if len(msgs) > 0 {
		timer := time.AfterFunc(f.cfg.PublishTimeout, func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.state == callRunning {
				c.state = callTimedOut
				ev := callEvent{c: c, kind: eventTimeout, err: fmt.Errorf("%w: Publish did not return within PublishTimeout %v", errPublishTimeout, f.cfg.PublishTimeout)}
				select {
				case events <- ev:
				case <-quit:
				}
			}
		})
		pctx, end := f.tel.startSend(context.Background(), topic, msgs)
		for _, m := range msgs {
			m.SetContext(pctx)
		}
		start := time.Now()
		err := f.publish(topic, msgs)
		ev.took = time.Since(start)
		timer.Stop()
		end(err)
		f.tel.publishDuration(pctx, topic, ev.took, err)
		ev.delivered = len(msgs)
		if err != nil {
			ev.delivered, ev.err = 0, err
			var pe *PartialError
			if errors.As(err, &pe) {
				ev.partial = true
				ev.delivered, ev.err = DeliveredPrefix(err, len(msgs)), pe.Err
				if ev.err == nil {
					ev.err = err
				}
			}
		}
	}
	if len(msgs) > 0 {
		ackAt := time.Now()
		for _, r := range c.rows[:ev.delivered] {
			if !r.Created.IsZero() {
				f.tel.commitToAck(context.Background(), topic, ackAt.Sub(r.Created))
			}
		}
		f.tel.sent(context.Background(), topic, ev.delivered)
		f.tel.failed(context.Background(), topic, len(msgs)-ev.delivered, ev.err)
	}
	if ev.err == nil && prepErr != nil && ev.delivered == len(msgs) {
		ev.err, ev.partial = prepErr, true // the row after the delivered ones is the culprit
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == callTimedOut {
		ev.kind = eventLate
	}
	c.state = callReturned
	select {
	case events <- ev:
	case <-quit:
	}
}

var errPublishTimeout = errors.New("publish timed out")

// publish hands messages bound for one topic to the destination.
func (f *Forwarder) publish(topic string, msgs []*message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("destination publisher panicked: %v", p)
		}
	}()
	return f.cfg.Destination.Publish(topic, msgs...)
}

// outgoing is a row turned into the message the destination receives.
type outgoing struct {
	topic string
	msg   *message.Message
	err   error
}

func (f *Forwarder) prepare(r sqladapters.OutboxRow) (o outgoing) {
	o.msg = message.NewMessage(r.UUID, r.Payload)
	if err := metadata.Decode(r.Metadata, &o.msg.Metadata); err != nil {
		o.err = failure.Permanent(fmt.Errorf("malformed metadata %.100q: %w", r.Metadata, err))
		return o
	}
	o.topic = r.Topic
	if f.cfg.Topic != nil {
		defer func() {
			if p := recover(); p != nil {
				o.err = fmt.Errorf("topic mapping panicked: %v", p)
			}
		}()
		topic, err := f.cfg.Topic(r.Topic, o.msg)
		switch {
		case err != nil:
			o.err = fmt.Errorf("topic mapping: %w", err)
		case topic == "":
			o.err = fmt.Errorf("topic mapping returned an empty topic for %q", r.Topic)
		}
		o.topic = topic
	}
	return o
}
