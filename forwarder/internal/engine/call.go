package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/metadata"
	"github.com/millbox/millbox/forwarder/internal/source"
)

// call is one lane's part of a destination call: consecutive rows of the
// lane, in order. Outside exactly-once mode a call is a Publish call of
// its own; in it, the calls of several lanes go into one transaction
// (txCall).
type call struct {
	lane  *lane
	rows  []*source.Row
	probe bool // sent while the breaker is open, to see if the destination is back
	left  bool // its rows were given back to the source after it timed out
}

// callEvent reports a Publish call to the loop. A call reports done, or
// timeout followed by late (in this order, through one channel).
type callEvent struct {
	c         *call
	kind      int  // eventDone, eventTimeout, eventLate, eventTx
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

// timeoutGrace is how long after its context's deadline a call may take
// to return before it counts as timed out: a destination that honours
// the deadline returns with its own error (a broker that did not answer,
// which opens the breaker), not as a call that hung.
func timeoutGrace(d time.Duration) time.Duration {
	return min(max(d/10, 50*time.Millisecond), time.Second)
}

// errPublishTimeout is what a call that passed PublishTimeout counts as.
var errPublishTimeout = errors.New("publish timed out")

// IsTimeout tells whether err is a call that passed PublishTimeout.
func IsTimeout(err error) bool { return errors.Is(err, errPublishTimeout) }

// runCall publishes one lane's rows in a Publish call.
func (e *Engine) runCall(c *call) { e.run([]*call{c}, nil, nil) }

// run is the one runner of destination calls: a Publish call of one
// lane's rows (tc nil), or in exactly-once mode a transaction of tc
// carrying the rows of several lanes of one partition and its progress.
// It turns the rows into messages, starts the call's span, and bounds the
// call with PublishTimeout: when that passes, the call's context is
// cancelled (the messages' context, or PublishTx's) and the loop hears of
// the timeout (a short grace after the deadline, for a destination that
// honours it to return its own error) at once, and of the call's return
// when it comes, so that a
// key whose call hangs stays held without holding up the rest. Then it
// records the call's metrics and reports its outcome to the loop, unless
// the engine stopped meanwhile: it does not wait for calls past
// PublishTimeout.
func (e *Engine) run(calls []*call, tc *txCall, progress []byte) {
	// The messages of each call, in order, up to the first row that
	// cannot be turned into one; a Publish call also stops before the
	// first row for another topic: those are left for a later call.
	prepared := make([]int, len(calls))
	prepErr := make([]error, len(calls))
	var msgs []*message.Message
	var topics []string // of msgs
	for i, c := range calls {
		for j, r := range c.rows {
			o := e.prepare(r)
			if o.err != nil {
				prepErr[i] = o.err
				break
			}
			if tc == nil && j > 0 && o.topic != topics[0] {
				break
			}
			msgs = append(msgs, o.msg)
			topics = append(topics, o.topic)
			prepared[i]++
		}
	}
	var err error
	var took time.Duration
	fl := &flight{}
	if len(msgs) > 0 {
		pctx, end := e.obs.StartSend(context.Background(), topics[0], msgs)
		ctx, cancel := context.WithTimeout(pctx, e.cfg.PublishTimeout)
		timer := time.AfterFunc(e.cfg.PublishTimeout+timeoutGrace(e.cfg.PublishTimeout), func() {
			if fl.timeOut() {
				cause := fmt.Errorf("%w: the destination did not return within PublishTimeout %v", errPublishTimeout, e.cfg.PublishTimeout)
				if tc == nil {
					report(e, e.calls, callEvent{c: calls[0], kind: eventTimeout, err: cause})
				} else {
					report(e, e.tx.events, txEvent{tc: tc, timeout: true, err: cause})
				}
			}
		})
		for _, m := range msgs {
			m.SetContext(ctx)
		}
		start := time.Now()
		if tc == nil {
			err = e.publish(topics[0], msgs)
		} else {
			err = e.publishTx(ctx, tc.id, calls, prepared, msgs, topics, progress)
		}
		took = time.Since(start)
		timer.Stop()
		cancel()
		end(err)
		e.obs.Called(pctx, topics[0], took, err)
	}
	late := fl.returned()

	if tc != nil {
		e.observeSent(calls, prepared, topics, sentAll(err, len(msgs)), err)
		report(e, e.tx.events, txEvent{tc: tc, prepared: prepared, prepErr: prepErr, err: err, took: took})
		return
	}
	ev := callEvent{c: calls[0], kind: eventDone, delivered: prepared[0], took: took}
	if late {
		ev.kind = eventLate
	}
	if err != nil {
		ev.delivered, ev.err = 0, err
		var pe *destination.PartialError
		if errors.As(err, &pe) {
			ev.partial = true
			ev.delivered, ev.err = destination.DeliveredPrefix(err, len(msgs)), pe.Err
			if ev.err == nil {
				ev.err = err
			}
		}
	}
	if len(msgs) > 0 {
		e.observeSent(calls, []int{ev.delivered}, topics, ev.delivered, ev.err)
	}
	if ev.err == nil && prepErr[0] != nil && ev.delivered == len(msgs) {
		ev.err, ev.partial = prepErr[0], true // the row after the delivered ones is the culprit
	}
	report(e, e.calls, ev)
}

// sentAll is how many of n messages a transaction delivered: all or none.
func sentAll(err error, n int) int {
	if err != nil {
		return 0
	}
	return n
}

// observeSent reports the first delivered of msgs (in call order, to
// topics) as sent, the rest as failed with err, and the age of each
// delivered row.
func (e *Engine) observeSent(calls []*call, prepared []int, topics []string, delivered int, err error) {
	ackAt := time.Now()
	i := 0
	for k, c := range calls {
		for _, r := range c.rows[:prepared[k]] {
			if i < delivered && !r.Created.IsZero() {
				e.obs.Acked(topics[i], ackAt.Sub(r.Created))
			}
			i++
		}
	}
	for from := 0; from < len(topics); {
		to := from + 1
		for to < len(topics) && topics[to] == topics[from] {
			to++
		}
		ok := max(min(delivered, to)-from, 0)
		e.obs.Sent(topics[from], ok)
		e.obs.Failed(topics[from], to-from-ok, err)
		from = to
	}
}

// report hands an event to the loop, unless the engine stopped.
func report[T any](e *Engine, events chan<- T, ev T) {
	select {
	case events <- ev:
	case <-e.quit:
	}
}

// flight is a call in flight: its runner and its timer agree through it
// whether the call passed PublishTimeout before it returned.
type flight struct {
	mu               sync.Mutex
	timedOut, closed bool
}

// timeOut marks the call timed out unless it returned; the timer reports
// the timeout when it did.
func (f *flight) timeOut() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.timedOut = true
	return true
}

// returned marks the call returned and tells whether it had timed out.
func (f *flight) returned() (late bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return f.timedOut
}

// publish hands messages bound for one topic to the destination.
func (e *Engine) publish(topic string, msgs []*message.Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("destination publisher panicked: %v", p)
		}
	}()
	return e.cfg.Destination.Publish(topic, msgs...)
}

// publishTx hands a transaction to the destination: a batch per call with
// the messages prepared for it. A *TxAbortedError names the failed batches
// by call index in what it returns.
func (e *Engine) publishTx(ctx context.Context, partition int, calls []*call, prepared []int, msgs []*message.Message, topics []string, progress []byte) (err error) {
	batches := make([]destination.TxBatch, 0, len(calls))
	index := make([]int, 0, len(calls)) // batch -> call
	i := 0
	for k, c := range calls {
		n := prepared[k]
		if n == 0 {
			continue
		}
		b := destination.TxBatch{Key: c.lane.okey, Messages: make([]destination.TxMessage, n)}
		for j := range n {
			b.Messages[j] = destination.TxMessage{Topic: topics[i], Message: msgs[i]}
			i++
		}
		batches = append(batches, b)
		index = append(index, k)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("destination publisher panicked: %v", p)
		}
		var aborted *destination.TxAbortedError
		if errors.As(err, &aborted) {
			byCall := make(map[int]error, len(aborted.Failed))
			for b, cause := range aborted.Failed {
				if b >= 0 && b < len(index) {
					byCall[index[b]] = cause
				}
			}
			err = &destination.TxAbortedError{Failed: byCall, Err: aborted.Err}
		}
	}()
	return e.cfg.Tx.PublishTx(ctx, partition, batches, progress)
}

// outgoing is a row turned into the message the destination receives.
type outgoing struct {
	topic string
	msg   *message.Message
	err   error
}

// prepare turns a row into its message: the stored UUID, payload and
// metadata, the ordering key in destination.KeyMetadataField, and the
// destination topic.
func (e *Engine) prepare(r *source.Row) (o outgoing) {
	o.msg = message.NewMessage(r.UUID, r.Payload)
	if err := metadata.Decode(r.Metadata, &o.msg.Metadata); err != nil {
		o.err = failure.Permanent(fmt.Errorf("malformed metadata %.100q: %w", r.Metadata, err))
		return o
	}
	if r.Keyed {
		if o.msg.Metadata == nil {
			o.msg.Metadata = make(message.Metadata, 1)
		}
		o.msg.Metadata[destination.KeyMetadataField] = r.Key
	}
	o.topic = r.Topic
	if e.cfg.Topic != nil {
		defer func() {
			if p := recover(); p != nil {
				o.err = fmt.Errorf("topic mapping panicked: %v", p)
			}
		}()
		topic, err := e.cfg.Topic(r.Topic, o.msg)
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
