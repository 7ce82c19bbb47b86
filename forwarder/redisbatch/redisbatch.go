package redisbatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/millbox/millbox/forwarder/destination"
)

// DefaultTimeout bounds a call whose context has no deadline, when
// Config.Timeout is not set.
const DefaultTimeout = 10 * time.Second

// MaxEntryBytes is the most bytes one field of a stream entry may hold:
// Redis's default proto-max-bulk-len (512 MiB). Redis closes the
// connection of a client that sends more, which would look like the
// server going away; Publish refuses such a message instead.
const MaxEntryBytes = 512 << 20

// Config configures a Publisher.
type Config struct {
	// Client is the Redis client (redis.NewClient, NewFailoverClient,
	// NewClusterClient, ...). Required. Close leaves it open: it belongs
	// to the caller.
	Client redis.UniversalClient
	// Marshaller turns messages into stream entries. Defaults to
	// watermill-redisstream's DefaultMarshallerUnmarshaller, whose
	// subscriber reads them.
	Marshaller redisstream.Marshaller
	// MaxLen returns the length a topic's stream is trimmed to as entries
	// are added (XADD MAXLEN ~, approximate, as watermill-redisstream
	// trims), 0 for no trimming. Trimming drops the oldest entries whether
	// or not every consumer group has read them. Defaults to no trimming.
	MaxLen func(topic string) int64
	// Timeout bounds one call when it ends before the call's own
	// deadline, the deadline of the first message's context
	// (msgs[0].Context()), which the forwarder sets at its PublishTimeout
	// so that a call gives up when the forwarder does. A call Redis has
	// not answered by then fails with an error that wraps
	// destination.ErrDestinationUnavailable and names the limit, and none
	// of its messages counts as delivered. The client's own limits apply
	// as well: go-redis bounds each read and write by the client's
	// ReadTimeout and WriteTimeout (3 s by default) and lets a context's
	// deadline reach the connection only with
	// redis.Options.ContextTimeoutEnabled. Defaults to 0: the call's
	// deadline alone, and DefaultTimeout for a call whose context has
	// none.
	Timeout time.Duration
}

// Publisher adds each Publish call's messages to the topic's stream in
// one MULTI/EXEC transaction.
type Publisher struct {
	client     redis.UniversalClient
	marshaller redisstream.Marshaller
	maxLen     func(topic string) int64
	timeout    time.Duration // Config.Timeout, 0 for none
	closed     atomic.Bool
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher validates cfg. It does not contact Redis: the first Publish
// does.
func NewPublisher(cfg Config) (*Publisher, error) {
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: redisbatch.Config.Client is required", destination.ErrInvalidConfig)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("%w: redisbatch.Config.Timeout must not be negative", destination.ErrInvalidConfig)
	}
	if cfg.Marshaller == nil {
		cfg.Marshaller = redisstream.DefaultMarshallerUnmarshaller{}
	}
	return &Publisher{client: cfg.Client, marshaller: cfg.Marshaller, maxLen: cfg.MaxLen, timeout: cfg.Timeout}, nil
}

// Publish adds msgs to the stream named topic, in order, and waits for
// Redis's answer, until the deadline of the first message's context (the
// forwarder's PublishTimeout) or Config.Timeout, whichever ends first.
//
// It returns nil when every message was added. Otherwise it returns a
// *destination.PartialError when a prefix of msgs was added, or a plain
// error when none was; either way no message after the first failed one
// was added (see the package doc). Failures of the server rather than of
// a message (unreachable, connection lost, no answer in time, loading,
// out of memory, read-only replica) wrap
// destination.ErrDestinationUnavailable.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	if p.closed.Load() {
		return fmt.Errorf("millbox: redisbatch: %w", destination.ErrClosed)
	}
	// A message that cannot be added ends the call before it, so that
	// the stream never gets a later message of the key without it.
	entries := make([]map[string]any, 0, len(msgs))
	var stop error
	for _, m := range msgs {
		e, err := p.entry(topic, m)
		if err != nil {
			stop = err
			break
		}
		entries = append(entries, e)
	}
	added, err := p.add(msgs[0].Context(), topic, msgs, entries)
	switch {
	case err == nil && stop == nil:
		return nil
	case err == nil:
		err = stop
	}
	if added == 0 {
		return err
	}
	return &destination.PartialError{Delivered: added, Err: err}
}

// entry marshals m and checks that Redis will take it.
func (p *Publisher) entry(topic string, m *message.Message) (map[string]any, error) {
	e, err := p.marshaller.Marshal(topic, m)
	if err != nil {
		return nil, fmt.Errorf("millbox: redisbatch: marshal message %s: %w", m.UUID, err)
	}
	if len(e) == 0 {
		return nil, fmt.Errorf("millbox: redisbatch: message %s: the marshaller gave a stream entry without fields", m.UUID)
	}
	for field, v := range e {
		n := len(field)
		switch v := v.(type) {
		case []byte:
			n = max(n, len(v))
		case string:
			n = max(n, len(v))
		}
		if n > MaxEntryBytes {
			return nil, fmt.Errorf("millbox: redisbatch: message %s: field %q of its stream entry is larger than Redis takes (%d bytes)", m.UUID, field, MaxEntryBytes)
		}
	}
	return e, nil
}

// limit is what bounds a call: a duration and the setting it comes from,
// for errors.
type limit struct {
	d    time.Duration
	name string
}

func (l limit) String() string { return fmt.Sprintf("%v (%s)", l.d.Round(time.Millisecond), l.name) }

// bound returns the context of a call made with ctx: it ends at ctx's
// deadline or Timeout, whichever is first (DefaultTimeout when neither is
// set), and when ctx ends.
func (p *Publisher) bound(ctx context.Context) (context.Context, context.CancelFunc, limit) {
	now := time.Now()
	if d, ok := ctx.Deadline(); ok && (p.timeout == 0 || d.Before(now.Add(p.timeout))) {
		ctx, cancel := context.WithCancel(ctx)
		return ctx, cancel, limit{max(d.Sub(now), 0), "the call's deadline"}
	}
	lim := limit{p.timeout, "Timeout"}
	if lim.d == 0 {
		lim = limit{DefaultTimeout, "DefaultTimeout"}
	}
	ctx, cancel := context.WithTimeout(ctx, lim.d)
	return ctx, cancel, lim
}

// add runs MULTI, one XADD per entry, EXEC, and returns how many leading
// entries Redis added and, when that is not all, why the next one failed.
func (p *Publisher) add(ctx context.Context, topic string, msgs []*message.Message, entries []map[string]any) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	ctx, cancel, lim := p.bound(ctx)
	defer cancel()
	var maxLen int64
	if p.maxLen != nil {
		maxLen = p.maxLen(topic)
	}
	var adds []*redis.StringCmd
	_, err := p.client.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, e := range entries {
			adds = append(adds, pipe.XAdd(ctx, &redis.XAddArgs{Stream: topic, Values: e, MaxLen: maxLen, Approx: maxLen > 0}))
		}
		return nil
	})
	// An entry was added when its XADD answered with the entry's id. A
	// command that never ran (no connection) has neither id nor error.
	added := 0
	for added < len(adds) && adds[added].Err() == nil && adds[added].Val() != "" {
		added++
	}
	if added == len(adds) {
		return added, nil
	}
	if e := adds[added].Err(); e != nil {
		err = e
	}
	if err == nil {
		err = errors.New("no answer to the command")
	}
	return added, fmt.Errorf("millbox: redisbatch: %d of %d messages not added to stream %s, first %s: %w",
		len(entries)-added, len(entries), topic, msgs[added].UUID, p.classify(ctx, lim, err))
}

// classify tells a failure of the server from a failure of a message; ctx
// is the call's, bounded by lim.
func (p *Publisher) classify(ctx context.Context, lim limit, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, redis.ErrClosed) || p.closed.Load():
		return fmt.Errorf("%w: %w", destination.ErrClosed, err)
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("the call's context was cancelled: %w", err)
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout() && past(ctx)):
		return destination.DestinationUnavailable(fmt.Errorf("no answer within %v: %w", lim, err))
	case errors.As(err, &ne) && ne.Timeout():
		return destination.DestinationUnavailable(fmt.Errorf("no answer in time (the client's read or write timeout): %w", err))
	case errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE):
		return destination.DestinationUnavailable(fmt.Errorf("server unreachable or connection lost: %w", err))
	case errors.Is(err, redis.ErrPoolTimeout):
		return destination.DestinationUnavailable(fmt.Errorf("no connection to the server free in time: %w", err))
	}
	for _, s := range serverStates {
		if redis.HasErrorPrefix(err, s.prefix) {
			return destination.DestinationUnavailable(fmt.Errorf("%s: %w", s.means, err))
		}
	}
	return err
}

// past tells whether ctx's deadline has passed; a connection's deadline
// set to it can end a read before ctx's own timer fires.
func past(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || (ok && !time.Now().Before(d))
}

// serverStates are the Redis errors that every message would get until
// the server's state changes.
var serverStates = []struct{ prefix, means string }{
	{"LOADING", "the server is loading its data after a restart"},
	{"MASTERDOWN", "the replica lost its primary"},
	{"CLUSTERDOWN", "the cluster is down"},
	{"TRYAGAIN", "the cluster is moving the stream's slot"},
	{"READONLY", "the server is a read-only replica (a failover?)"},
	{"BUSY", "the server is running a long script"},
	{"OOM", "the server is out of memory (maxmemory)"},
	{"EXECABORT", "the server refused a command of the transaction when queuing it, as it does when out of memory (maxmemory)"},
	{"max number of clients reached", "the server takes no more clients"},
}

// Close makes later Publish calls fail with destination.ErrClosed. It does
// not close Config.Client.
func (p *Publisher) Close() error {
	p.closed.Store(true)
	return nil
}
