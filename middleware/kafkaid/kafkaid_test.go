package kafkaid_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/middleware/kafkaid"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestKafkaIDNeedsKafkaContext(t *testing.T) {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	if _, err := kafkaid.MessageID(msg); err == nil || !strings.Contains(err.Error(), "topic") {
		t.Fatalf("want an error about the missing topic, got %v", err)
	}
}

// A message that did not come from Kafka fails in the inbox middleware
// before any transaction begins, so the unusable DB of this test is never
// touched.
func TestNotFromKafkaFailsBeforeTheDatabase(t *testing.T) {
	mw, err := middleware.NewInbox(middleware.InboxConfig{
		DB: stdsql.WrapDB(nil), Dialect: postgres.MustNew(postgres.Options{}), Consumer: "billing", MessageID: kafkaid.MessageID,
	})
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	_, err = mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(message.NewMessage(watermill.NewUUID(), nil))
	if !errors.Is(err, middleware.ErrNoMessageID) || ran {
		t.Fatalf("want ErrNoMessageID without running the handler, got %v (ran %v)", err, ran)
	}
}
