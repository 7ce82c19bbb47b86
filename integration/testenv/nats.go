package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmnats "github.com/ThreeDotsLabs/watermill-nats/v2/pkg/nats"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSURL is the NATS server, with JetStream, the tests use.
func NATSURL() string { return Env("MILLBOX_NATS_URL", "nats://127.0.0.1:4222") }

// NATSOptions are the client options the helpers connect with: reconnect
// forever (nats.go gives up after 60 attempts by default, two minutes, and
// then the client stays closed), every 100 ms, so that a client rides out
// a server restart as a production client should.
func NATSOptions() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.Timeout(3 * time.Second),
	}
}

// RequireNATS returns the NATS URL after checking that the server answers
// and has JetStream; when it does not, the test fails in CI and is skipped
// elsewhere.
func RequireNATS(t testing.TB) string {
	t.Helper()
	url := NATSURL()
	if err := pingJetStream(url); err != nil {
		Unavailable(t, "NATS with JetStream", err)
	}
	return url
}

func pingJetStream(url string) error {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("JetStream: %w", err)
	}
	return nil
}

// CreateNATSStream creates a file-backed stream named name that takes the
// subjects name and name.> (a subject per key group under the topic), or
// the given subjects.
func CreateNATSStream(url, name string, subjects ...string) error {
	if len(subjects) == 0 {
		subjects = []string{name, name + ".>"}
	}
	return withJetStream(url, func(ctx context.Context, js jetstream.JetStream) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage})
		return err
	})
}

// DeleteNATSStreams deletes streams; unknown ones are not an error.
func DeleteNATSStreams(url string, names ...string) error {
	return withJetStream(url, func(ctx context.Context, js jetstream.JetStream) error {
		for _, n := range names {
			if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("delete stream %s: %w", n, err)
			}
		}
		return nil
	})
}

// DeleteNATSStreamsWithPrefix deletes the streams whose names start with
// prefix.
func DeleteNATSStreamsWithPrefix(url, prefix string) error {
	return withJetStream(url, func(ctx context.Context, js jetstream.JetStream) error {
		names := js.StreamNames(ctx)
		var doomed []string
		for n := range names.Name() {
			if strings.HasPrefix(n, prefix) {
				doomed = append(doomed, n)
			}
		}
		if err := names.Err(); err != nil {
			return err
		}
		for _, n := range doomed {
			if err := js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return fmt.Errorf("delete stream %s: %w", n, err)
			}
		}
		return nil
	})
}

func withJetStream(url string, fn func(context.Context, jetstream.JetStream) error) error {
	nc, err := nats.Connect(url, nats.Timeout(3*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return fn(ctx, js)
}

// NATSStream creates a stream with a unique name on the test server
// (CreateNATSStream) and deletes it after the test. Use the name as the
// Watermill topic.
func NATSStream(t testing.TB) string {
	t.Helper()
	url := RequireNATS(t)
	name := UniqueName("millbox_test_")
	if err := CreateNATSStream(url, name); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	t.Cleanup(func() {
		if err := DeleteNATSStreams(url, name); err != nil {
			t.Logf("%v", err)
		}
	})
	return name
}

// NATSPublisherConfig returns watermill-nats's publisher config for url
// with JetStream on: Publish waits for the stream's acknowledgement of each
// message. Streams are created beforehand (no AutoProvision, which would
// ask the server about the stream on every Publish call).
func NATSPublisherConfig(url string) wmnats.PublisherConfig {
	return wmnats.PublisherConfig{
		URL:         url,
		NatsOptions: NATSOptions(),
		Marshaler:   &wmnats.NATSMarshaler{},
		JetStream:   wmnats.JetStreamConfig{},
	}
}

// NATSPublisher returns a watermill-nats JetStream publisher for url,
// closed after the test.
func NATSPublisher(t testing.TB, url string) *wmnats.Publisher {
	t.Helper()
	p, err := wmnats.NewPublisher(NATSPublisherConfig(url), watermill.NopLogger{})
	if err != nil {
		t.Fatalf("nats publisher: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// NATSSubscriberConfig returns watermill-nats's subscriber config for url
// with JetStream on, reading each stream from its first message with
// explicit acknowledgements. A durable name (consumer group) keeps the
// consumer's position on the server, across client reconnects and server
// restarts; without one the consumer is ephemeral.
func NATSSubscriberConfig(url, durable string) wmnats.SubscriberConfig {
	return wmnats.SubscriberConfig{
		URL:              url,
		QueueGroupPrefix: durable,
		NatsOptions:      NATSOptions(),
		Unmarshaler:      &wmnats.NATSMarshaler{},
		AckWaitTimeout:   30 * time.Second,
		CloseTimeout:     10 * time.Second,
		SubscribeTimeout: 10 * time.Second,
		JetStream: wmnats.JetStreamConfig{
			SubscribeOptions: []nats.SubOpt{nats.DeliverAll(), nats.AckExplicit()},
			DurablePrefix:    durable,
		},
	}
}

// WatermillCollector records in its Collection every message a Watermill
// subscriber delivers on its topics, acknowledging each once recorded. Key
// is the KeyMetadataField metadata.
type WatermillCollector struct {
	*Collection
	sub    message.Subscriber
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewWatermillCollector subscribes sub to topics and records what arrives.
// Close stops it and closes sub.
func NewWatermillCollector(sub message.Subscriber, topics ...string) (*WatermillCollector, error) {
	ctx, cancel := context.WithCancel(context.Background())
	c := &WatermillCollector{Collection: newCollection(), sub: sub, cancel: cancel}
	for _, topic := range topics {
		msgs, err := sub.Subscribe(ctx, topic)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("subscribe %s: %w", topic, err)
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			for m := range msgs {
				c.add(watermillRecord(topic, m))
				m.Ack()
			}
		}()
	}
	return c, nil
}

func watermillRecord(topic string, m *message.Message) Record {
	rec := Record{UUID: m.UUID, Topic: topic, Metadata: make(map[string]string, len(m.Metadata)), Arrived: time.Now()}
	for k, v := range m.Metadata {
		rec.Metadata[k] = v
	}
	rec.Key = rec.Metadata[KeyMetadataField]
	return rec
}

// Close stops receiving and closes the subscriber.
func (c *WatermillCollector) Close() {
	c.cancel()
	_ = c.sub.Close()
	c.wg.Wait()
}

// CollectNATS records what a watermill-nats JetStream subscriber with a
// durable consumer of its own (NATSSubscriberConfig) receives on stream,
// from its first message; it is closed after the test.
func CollectNATS(t testing.TB, url, stream string) *WatermillCollector {
	t.Helper()
	sub, err := wmnats.NewSubscriber(NATSSubscriberConfig(url, UniqueName("collector_")), watermill.NopLogger{})
	if err != nil {
		t.Fatalf("nats subscriber: %v", err)
	}
	c, err := NewWatermillCollector(sub, stream)
	if err != nil {
		t.Fatalf("nats collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// NATSServer is a nats-server with JetStream the test runs on a port of its
// own (ServerProcess), for tests that stop and restart it. Streams are
// stored in its data directory and survive restarts.
type NATSServer struct {
	*ServerProcess
}

// StartNATSServer starts nats-server with JetStream for the test; it is
// stopped after the test. Without the binary the test fails in CI and is
// skipped elsewhere.
func StartNATSServer(t testing.TB) *NATSServer {
	t.Helper()
	p := startServerProcess(t, "nats-server", "nats-server",
		func(port int, dir string) []string {
			return []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "jetstream")}
		},
		func(port int) func() error {
			return func() error { return pingJetStream("nats://127.0.0.1:" + strconv.Itoa(port)) }
		})
	return &NATSServer{p}
}

// URL returns the server's client URL.
func (s *NATSServer) URL() string { return "nats://" + s.Addr() }

// NATSStreamCollector reads a stream from its first message with an
// ordered consumer (no acknowledgements, so it keeps up with any
// publisher; it recreates itself after a server restart and resumes after
// the last message it got) and records each message in its Collection.
// Offset is the stream sequence, Key the KeyMetadataField header.
type NATSStreamCollector struct {
	*Collection
	nc *nats.Conn
	cc jetstream.ConsumeContext
}

// NewNATSStreamCollector starts reading stream at url. The caller calls
// Close.
func NewNATSStreamCollector(url, stream string) (*NATSStreamCollector, error) {
	nc, err := nats.Connect(url, NATSOptions()...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("ordered consumer on %s: %w", stream, err)
	}
	c := &NATSStreamCollector{Collection: newCollection(), nc: nc}
	c.cc, err = cons.Consume(func(m jetstream.Msg) { c.add(natsRecord(stream, m)) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { c.setErr(err) }))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func natsRecord(stream string, m jetstream.Msg) Record {
	rec := Record{Topic: stream, Metadata: map[string]string{}, Arrived: time.Now()}
	for k, v := range m.Headers() {
		if len(v) == 0 {
			continue
		}
		if k == wmnats.WatermillUUIDHdr {
			rec.UUID = v[0]
		} else {
			rec.Metadata[k] = v[0]
		}
	}
	if md, err := m.Metadata(); err == nil {
		rec.Offset = int64(md.Sequence.Stream)
	}
	rec.Key = rec.Metadata[KeyMetadataField]
	return rec
}

// Close stops reading. The records collected so far stay readable.
func (c *NATSStreamCollector) Close() {
	c.cc.Stop()
	c.nc.Close()
}

// CollectNATSStream starts a NATSStreamCollector for the test, closed
// after it.
func CollectNATSStream(t testing.TB, url, stream string) *NATSStreamCollector {
	t.Helper()
	c, err := NewNATSStreamCollector(url, stream)
	if err != nil {
		t.Fatalf("nats stream collector: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}
