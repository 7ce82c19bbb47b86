package integration_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/components/cqrs"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/middleware"
)

func newContextOutbox(t *testing.T, f *pgInbox) *forwarder.Publisher {
	t.Helper()
	p, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: f.Dialect})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type inboxOrderPlaced struct {
	OrderID string `json:"order_id"`
}

type inboxInvoiceRequested struct {
	OrderID string `json:"order_id"`
}

// cqrs.EventProcessor runs each event handler as its own router handler;
// one router-wide inbox middleware keeps them apart, and an EventBus on the
// context outbox publisher produces in the handler's transaction.
func TestInboxCQRSEventProcessor(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		name := "PerHandler"
		if shared {
			name = "SharedAcrossHandlers"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newInboxFixture(t)
			gc := conformance.NewGoChannel(t, true)
			marshaler := cqrs.JSONMarshaler{}
			bus, err := cqrs.NewEventBusWithConfig(newContextOutbox(t, f), cqrs.EventBusConfig{
				GeneratePublishTopic: func(p cqrs.GenerateEventPublishTopicParams) (string, error) { return p.EventName, nil },
				Marshaler:            marshaler,
			})
			if err != nil {
				t.Fatal(err)
			}
			var ran atomic.Int64
			conformance.StartRouter(t, func(r *message.Router) {
				r.AddMiddleware(f.Middleware("orders", func(c *middleware.InboxConfig) { c.SharedAcrossHandlers = shared }))
				ep, err := cqrs.NewEventProcessorWithConfig(r, cqrs.EventProcessorConfig{
					GenerateSubscribeTopic: func(p cqrs.EventProcessorGenerateSubscribeTopicParams) (string, error) { return p.EventName, nil },
					// GoChannel gives each handler's subscription every event.
					SubscriberConstructor: func(cqrs.EventProcessorSubscriberConstructorParams) (message.Subscriber, error) { return gc, nil },
					Marshaler:             marshaler,
				})
				if err != nil {
					t.Fatal(err)
				}
				err = ep.AddHandlers(
					cqrs.NewEventHandler("billing", func(ctx context.Context, e *inboxOrderPlaced) error {
						ran.Add(1)
						if err := f.ApplyEffect(ctx, "billing:"+e.OrderID); err != nil {
							return err
						}
						conformance.MarkHandled(cqrs.OriginalMessageFromCtx(ctx))
						return bus.Publish(ctx, &inboxInvoiceRequested{OrderID: e.OrderID})
					}),
					cqrs.NewEventHandler("shipping", func(ctx context.Context, e *inboxOrderPlaced) error {
						ran.Add(1)
						if err := f.ApplyEffect(ctx, "shipping:"+e.OrderID); err != nil {
							return err
						}
						conformance.MarkHandled(cqrs.OriginalMessageFromCtx(ctx))
						return nil
					}),
				)
				if err != nil {
					t.Fatal(err)
				}
			})
			event, err := marshaler.Marshal(&inboxOrderPlaced{OrderID: "o-1"})
			if err != nil {
				t.Fatal(err)
			}
			conformance.PublishCopies(t, gc, marshaler.Name(&inboxOrderPlaced{}), event, 3)
			f.WaitDeliveries(6) // 3 copies x 2 handlers

			effects := f.Effects()
			pending := conformance.ReadPending(t, context.Background(), f.DB, f.Dialect)
			if !shared {
				if ran.Load() != 2 || effects["billing:o-1"] != 1 || effects["shipping:o-1"] != 1 {
					t.Fatalf("handler runs %d, effects %v; want each handler once", ran.Load(), effects)
				}
				rows := f.InboxRows()
				if len(rows) != 2 || !strings.HasPrefix(rows[0], "orders/billing|") || !strings.HasPrefix(rows[1], "orders/shipping|") {
					t.Fatalf("inbox rows %v", rows)
				}
				if len(pending) != 1 || pending[0].Topic != marshaler.Name(&inboxInvoiceRequested{}) {
					t.Fatalf("outbox rows %+v, want one InvoiceRequested", pending)
				}
				return
			}
			// Shared: the first handler to record the event wins.
			if ran.Load() != 1 || len(effects) != 1 || f.Duplicates() != 5 {
				t.Fatalf("handler runs %d, effects %v, duplicates %d; want one run", ran.Load(), effects, f.Duplicates())
			}
			if rows := f.InboxRows(); len(rows) != 1 || !strings.HasPrefix(rows[0], "orders|") {
				t.Fatalf("inbox rows %v", rows)
			}
		})
	}
}
