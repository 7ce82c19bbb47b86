package integration_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/integration/testenv"
)

// keyedMessages returns n messages spread over keys, each carrying its key
// and its position within the key ("seq"), plus the expected order per key.
func keyedMessages(n, keys int, payload []byte) ([]*message.Message, map[string][]string) {
	msgs := make([]*message.Message, n)
	order := map[string][]string{}
	for i := range msgs {
		key := "key-" + strconv.Itoa(i%keys)
		m := message.NewMessage(watermill.NewUUID(), payload)
		m.Metadata.Set(testenv.KeyMetadataField, key)
		m.Metadata.Set("seq", strconv.Itoa(i/keys))
		msgs[i] = m
		order[key] = append(order[key], m.UUID)
	}
	return msgs, order
}

func publishEach(t *testing.T, pub message.Publisher, topic string, msgs []*message.Message) {
	t.Helper()
	for _, m := range msgs {
		if err := pub.Publish(topic, m); err != nil {
			t.Fatalf("publish %s: %v", m.UUID, err)
		}
	}
}

func uuids(msgs []*message.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.UUID
	}
	return out
}

func TestKafkaKeyedPublishCollectOrder(t *testing.T) {
	t.Parallel()
	topic := testenv.UniqueName("orders_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	pub := k.KeyedPublisher(t)

	msgs, order := keyedMessages(1000, 10, []byte(`{"n":1}`))
	publishEach(t, pub, topic, msgs)

	ctx := testenv.Ctx(t, time.Minute)
	if err := col.WaitN(ctx, len(msgs), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckOrder(order); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	if d := col.Duplicates(); d != 0 {
		t.Fatalf("%d duplicates from a plain publish", d)
	}
	partitions := map[int32]bool{}
	for _, r := range col.FirstDeliveries() {
		if r.Key != r.Metadata[testenv.KeyMetadataField] {
			t.Fatalf("record key %q, metadata key %q", r.Key, r.Metadata[testenv.KeyMetadataField])
		}
		partitions[r.Partition] = true
	}
	if len(partitions) < 2 {
		t.Fatalf("10 keys landed on %d partition(s); the key does not drive partitioning", len(partitions))
	}
}

func TestKafkaCollectorReportsMissing(t *testing.T) {
	t.Parallel()
	topic := testenv.UniqueName("missing_")
	k := testenv.StartKafka(t, topic)
	col := k.Collect(t, topic)
	msgs, _ := keyedMessages(10, 2, nil)
	publishEach(t, k.KeyedPublisher(t), topic, msgs[:8])

	err := col.WaitUUIDs(context.Background(), uuids(msgs), 2*time.Second)
	if err == nil {
		t.Fatal("WaitUUIDs succeeded with two messages never published")
	}
	for _, m := range msgs[8:] {
		if !strings.Contains(err.Error(), m.UUID) {
			t.Fatalf("error does not name missing %s: %v", m.UUID, err)
		}
	}
	err = col.WaitN(context.Background(), 10, time.Second)
	if err == nil || !strings.Contains(err.Error(), "8 of 10") {
		t.Fatalf("WaitN error = %v, want a count of 8 of 10", err)
	}
}

func TestKafkaRestartSamePort(t *testing.T) {
	t.Parallel()
	topic := testenv.UniqueName("restart_")
	k := testenv.StartKafka(t, topic)
	addr := k.Addr()
	col := k.Collect(t, topic)
	pub := k.KeyedPublisher(t)

	before, _ := keyedMessages(100, 4, []byte("before"))
	publishEach(t, pub, topic, before)
	ctx := testenv.Ctx(t, time.Minute)
	if err := col.WaitN(ctx, 100, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	k.Stop()
	if err := pub.Publish(topic, message.NewMessage(watermill.NewUUID(), nil)); err == nil {
		t.Fatal("publish succeeded while the broker was stopped")
	}
	if err := k.Restart(); err != nil {
		t.Fatal(err)
	}
	if k.Addr() != addr {
		t.Fatalf("restarted on %s, was %s", k.Addr(), addr)
	}

	// The same publisher and collector reconnect by themselves.
	after, _ := keyedMessages(100, 4, []byte("after"))
	publishEach(t, pub, topic, after)
	if err := col.WaitUUIDs(ctx, append(uuids(before), uuids(after)...), 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// The data directory kept the records from before the restart.
	fresh := k.Collect(t, topic)
	if err := fresh.WaitUUIDs(ctx, uuids(before), 30*time.Second); err != nil {
		t.Fatalf("records from before the restart: %v", err)
	}
}

func TestRabbitV3PublishCollectConfirms(t *testing.T) {
	t.Parallel()
	queue := testenv.AMQPQueue(t)
	col := testenv.CollectAMQP(t, queue)
	pub := testenv.AMQPPublisher(t)
	testRabbitPublishCollect(t, pub, queue, col)
}

func TestRabbitV2PublishCollectConfirms(t *testing.T) {
	t.Parallel()
	queue := testenv.AMQPQueue(t)
	col := testenv.CollectAMQP(t, queue)
	pub := testenv.AMQPPublisherV2(t)
	testRabbitPublishCollect(t, pub, queue, col)
}

func testRabbitPublishCollect(t *testing.T, pub message.Publisher, queue string, col *testenv.AMQPCollector) {
	t.Helper()
	msgs, order := keyedMessages(500, 5, []byte(`{"n":1}`))
	publishEach(t, pub, queue, msgs)
	ctx := testenv.Ctx(t, time.Minute)
	if err := col.WaitUUIDs(ctx, uuids(msgs), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckOrder(order); err != nil {
		t.Fatal(err)
	}
	if err := col.CheckSeqOrder("seq"); err != nil {
		t.Fatal(err)
	}
	r, _ := col.Get(msgs[0].UUID)
	if r.Key != "key-0" || r.Metadata["seq"] != "0" || r.Topic != queue {
		t.Fatalf("first record = %+v", r)
	}
}
