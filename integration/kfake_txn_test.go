package integration_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/millbox/millbox/integration/testenv"
)

// The exactly-once tests run against kfake. These tests check that kfake
// does what a Kafka cluster does for them: a second producer with the same
// transactional.id fences the first (its open transaction is aborted, its
// commit fails, and so does a transaction it begins afterwards), and a
// read_committed consumer does not see aborted records.

func txnClient(t *testing.T, k *testenv.Kafka, id string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(testenv.KgoProducerOptions(),
		kgo.SeedBrokers(k.Addrs()...),
		kgo.TransactionalID(id),
		kgo.TransactionTimeout(10*time.Second),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func produceInTxn(t *testing.T, cl *kgo.Client, topic string, values ...string) {
	t.Helper()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("produce %s: %v", v, err)
		}
	}
}

// readCommitted returns the values of topic's partition 0 that a
// read_committed (or, with committed false, read_uncommitted) consumer
// sees. It first appends an end mark outside any transaction and reads
// up to it.
func readCommitted(t *testing.T, k *testenv.Kafka, topic string, committed bool) []string {
	t.Helper()
	ctx := testenv.Ctx(t, 30*time.Second)
	mark := testenv.UniqueName("end-")
	pcl, err := kgo.NewClient(append(testenv.KgoProducerOptions(), kgo.SeedBrokers(k.Addrs()...))...)
	if err != nil {
		t.Fatal(err)
	}
	defer pcl.Close()
	if err := pcl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(mark)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	level := kgo.ReadUncommitted()
	if committed {
		level = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(append(testenv.KgoProducerOptions(),
		kgo.SeedBrokers(k.Addrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}),
		kgo.FetchIsolationLevel(level),
		kgo.FetchMaxWait(100*time.Millisecond),
	)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var values []string
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("reading %s up to its end mark: %v (so far %q)", topic, err, values)
		}
		done := false
		fs.EachRecord(func(r *kgo.Record) {
			switch v := string(r.Value); {
			case v == mark:
				done = true
			case !done && !strings.HasPrefix(v, "end-"): // other reads' marks
				values = append(values, string(r.Value))
			}
		})
		if done {
			return values
		}
	}
}

func TestKfakeFencesTransactionalProducers(t *testing.T) {
	k := testenv.StartKafka(t)
	topic := testenv.UniqueName("fence_")
	if err := k.CreateTopics(testenv.Ctx(t, 10*time.Second), 1, topic); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Ctx(t, 30*time.Second)

	// A zombie with a transaction open when the new owner starts.
	zombie := txnClient(t, k, "fence-a")
	produceInTxn(t, zombie, topic, "zombie-open")
	owner := txnClient(t, k, "fence-a")
	if _, _, err := owner.ProducerID(ctx); err != nil {
		t.Fatal(err)
	}
	err := zombie.EndTransaction(ctx, kgo.TryCommit)
	if err == nil {
		t.Fatal("the fenced producer committed its open transaction")
	}
	t.Logf("open transaction of the fenced producer: %v", err)

	// A zombie idle when the new owner starts, which then begins a
	// transaction of its own.
	zombie2 := txnClient(t, k, "fence-b")
	produceInTxn(t, zombie2, topic, "zombie2-committed")
	if err := zombie2.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	owner2 := txnClient(t, k, "fence-b")
	if _, _, err := owner2.ProducerID(ctx); err != nil {
		t.Fatal(err)
	}
	if err := zombie2.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	perr := zombie2.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("zombie2-late")}).FirstErr()
	cerr := zombie2.EndTransaction(ctx, kgo.TryCommit)
	if perr == nil && cerr == nil {
		t.Fatal("the fenced producer began, produced and committed a transaction")
	}
	t.Logf("transaction begun after fencing: produce %v, commit %v", perr, cerr)

	// A zombie that began its transaction before the new owner started
	// and produces after.
	zombie3 := txnClient(t, k, "fence-c")
	produceInTxn(t, zombie3, topic, "zombie3-committed")
	if err := zombie3.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if err := zombie3.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	owner3 := txnClient(t, k, "fence-c")
	if _, _, err := owner3.ProducerID(ctx); err != nil {
		t.Fatal(err)
	}
	if err := zombie3.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("zombie3-late")}).FirstErr(); err == nil {
		t.Fatal("the fenced producer produced into the transaction it had begun")
	} else {
		t.Logf("transaction begun before fencing, produced after: %v", err)
	}

	// The new owners commit.
	produceInTxn(t, owner, topic, "owner")
	if err := owner.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	produceInTxn(t, owner2, topic, "owner2")
	if err := owner2.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	got := readCommitted(t, k, topic, true)
	if want := []string{"zombie2-committed", "zombie3-committed", "owner", "owner2"}; !slices.Equal(got, want) {
		t.Fatalf("read_committed sees %q, want %q", got, want)
	}
	all := readCommitted(t, k, topic, false)
	if !slices.Contains(all, "zombie-open") {
		t.Fatalf("read_uncommitted sees %q: the aborted record was never written, the check above proves nothing", all)
	}
}

func TestKfakeHidesAbortedRecords(t *testing.T) {
	k := testenv.StartKafka(t)
	topic := testenv.UniqueName("abort_")
	if err := k.CreateTopics(testenv.Ctx(t, 10*time.Second), 1, topic); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Ctx(t, 30*time.Second)
	cl := txnClient(t, k, "abort-a")
	produceInTxn(t, cl, topic, "a1", "a2")
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	produceInTxn(t, cl, topic, "b1", "b2")
	if err := cl.AbortBufferedRecords(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	produceInTxn(t, cl, topic, "c1")
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}
	if got, want := readCommitted(t, k, topic, true), []string{"a1", "a2", "c1"}; !slices.Equal(got, want) {
		t.Fatalf("read_committed sees %q, want %q", got, want)
	}
	if got, want := readCommitted(t, k, topic, false), []string{"a1", "a2", "b1", "b2", "c1"}; !slices.Equal(got, want) {
		t.Fatalf("read_uncommitted sees %q, want %q", got, want)
	}
}

// TestWatermillKafkaReadsCommitted: watermill-kafka's subscriber (sarama)
// with Consumer.IsolationLevel = sarama.ReadCommitted, as the package docs
// tell consumers of an exactly-once forwarder to configure it, does not
// deliver the records of an aborted transaction.
func TestWatermillKafkaReadsCommitted(t *testing.T) {
	k := testenv.StartKafka(t)
	topic := testenv.UniqueName("wmrc_")
	if err := k.CreateTopics(testenv.Ctx(t, 10*time.Second), 1, topic); err != nil {
		t.Fatal(err)
	}
	ctx := testenv.Ctx(t, 30*time.Second)
	cl := txnClient(t, k, "wmrc-a")
	record := func(v string) *kgo.Record {
		return &kgo.Record{Topic: topic, Value: []byte(v), Headers: []kgo.RecordHeader{{Key: kafka.UUIDHeaderKey, Value: []byte(v)}}}
	}
	for _, step := range []struct {
		values []string
		commit bool
	}{{[]string{"a1", "a2"}, true}, {[]string{"b1", "b2"}, false}, {[]string{"c1"}, true}} {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range step.values {
			if err := cl.ProduceSync(ctx, record(v)).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(step.commit)); err != nil {
			t.Fatal(err)
		}
	}
	_ = testenv.KafkaSaramaConfig() // sarama's go-metrics off
	sc := kafka.DefaultSaramaSubscriberConfig()
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
		Brokers: k.Addrs(), Unmarshaler: kafka.DefaultMarshaler{}, ConsumerGroup: testenv.UniqueName("g_"), OverwriteSaramaConfig: sc,
	}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 3 {
		select {
		case m := <-msgs:
			got = append(got, m.UUID)
			m.Ack()
		case <-ctx.Done():
			t.Fatalf("received %q, then nothing", got)
		}
	}
	select {
	case m := <-msgs:
		t.Fatalf("received %q and then %s", got, m.UUID)
	case <-time.After(time.Second):
	}
	if want := []string{"a1", "a2", "c1"}; !slices.Equal(got, want) {
		t.Fatalf("received %q, want %q", got, want)
	}
}
