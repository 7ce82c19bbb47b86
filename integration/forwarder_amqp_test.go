package integration_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/forwarder/amqpbatch"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// TestForwarderRabbitMQ forwards to RabbitMQ through watermill-amqp v3 with
// publisher confirms and a channel pool, through a v2 publisher, and
// through millbox's amqpbatch publisher: every message arrives, in order
// per key.
func TestForwarderRabbitMQ(t *testing.T) {
	for _, tc := range []struct {
		name      string
		publisher func(t *testing.T) message.Publisher
		keys, per int
	}{
		{"watermill-amqp-v3", func(t *testing.T) message.Publisher { return testenv.AMQPPublisher(t) }, 50, 100},
		{"watermill-amqp-v2", func(t *testing.T) message.Publisher { return testenv.AMQPPublisherV2(t) }, 20, 50},
		{"amqpbatch", func(t *testing.T) message.Publisher {
			p, err := amqpbatch.NewPublisher(amqpbatch.Config{URL: testenv.RequireAMQP(t)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			return p
		}, 50, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := testenv.Postgres(t)
			db := pgxv5.WrapPool(pool)
			d := testenv.PostgresDialect(t, db, pool, postgres.Options{})
			queue := testenv.AMQPQueue(t)
			col, err := testenv.NewAMQPCollector(testenv.AMQPURL(), queue)
			if err != nil {
				t.Fatal(err)
			}
			defer col.Close()
			conformance.StartForwarder(t, forwarder.Config{DB: db, Dialect: d, Destination: tc.publisher(t), Logger: testenv.Logger(t)})
			conformance.WriteKeyed(t, context.Background(), pgxSource(db), d, queue, tc.keys, tc.per, 10, 4)
			if err := col.WaitN(context.Background(), tc.keys*tc.per, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := col.CheckSeqOrder("seq"); err != nil {
				t.Fatal(err)
			}
			if d := col.Duplicates(); d != 0 {
				t.Fatalf("%d duplicates in a clean run", d)
			}
		})
	}
}
