package integration_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
)

// TestEmitDelayed: a publisher without a table stores its delayed
// messages in the scheduled table (the other messages of the call go into
// the WAL); they arrive no earlier than their time, after the messages of
// their key that were not delayed, and the call stays one transaction.
func TestEmitDelayed(t *testing.T) {
	e := newCDCEnv(t)
	ctx := testenv.Ctx(t, time.Minute)
	e.setup(t, ctx)
	rec := conformance.NewRecorder()
	cfg := e.cfg
	cfg.Destination = rec
	conformance.SetPollInterval(&cfg, 100*time.Millisecond)
	e.start(t, cfg)

	keyed := func(name string) *message.Message {
		m := message.NewMessage(watermill.NewUUID(), []byte(name))
		m.Metadata.Set(forwarder.DefaultKeyMetadataField, "k")
		return m
	}
	due := time.Now().Add(time.Second)
	e0, d1, e1, far := keyed("e0"), keyed("d1"), keyed("e1"), keyed("far")
	forwarder.DeliverAt(d1, due)
	forwarder.DeliverAfter(far, time.Hour)
	if err := e.emit(ctx, "delayed", e0, d1, far, e1); err != nil {
		t.Fatal(err)
	}
	rec.WaitFor(t, 3, 30*time.Second)
	var order []string
	for _, m := range rec.Messages() {
		order = append(order, string(m.Payload))
		if m.UUID == d1.UUID {
			if m.At.Before(due) {
				t.Fatalf("the delayed message arrived at %v, before its due time %v", m.At, due)
			}
			if late := m.At.Sub(due); late > 10*time.Second {
				t.Fatalf("the delayed message arrived %v late", late)
			}
		}
	}
	if strings.Join(order, " ") != "e0 e1 d1" {
		t.Fatalf("key k arrived in the order %v, want e0 e1 d1", order)
	}
	st, err := e.d.OutboxStats(ctx, e.db)
	if err != nil {
		t.Fatal(err)
	}
	if st.Scheduled != 1 {
		t.Fatalf("stats %+v, want the message due in an hour scheduled", st)
	}
}
