package middleware_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestNewInboxConfig(t *testing.T) {
	valid := middleware.InboxConfig{
		DB:       stdsql.WrapDB(nil), // never used: no message is handled
		Dialect:  postgres.MustNew(postgres.Options{}),
		Consumer: "billing",
	}
	if _, err := middleware.NewInbox(valid); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		edit  func(*middleware.InboxConfig)
		field string
	}{
		{func(c *middleware.InboxConfig) { c.DB = nil }, "DB"},
		{func(c *middleware.InboxConfig) { c.Dialect = nil }, "Dialect"},
		{func(c *middleware.InboxConfig) { c.Consumer = "" }, "Consumer"},
		{func(c *middleware.InboxConfig) { c.Consumer = "a\x00b" }, "Consumer"},
		{func(c *middleware.InboxConfig) { c.TxOptions.ReadOnly = true }, "TxOptions.ReadOnly"},
		{func(c *middleware.InboxConfig) { c.CommitTimeout = -1 }, "CommitTimeout"},
	} {
		cfg := valid
		c.edit(&cfg)
		if _, err := middleware.NewInbox(cfg); !errors.Is(err, middleware.ErrInvalidConfig) || !strings.Contains(err.Error(), "InboxConfig."+c.field) {
			t.Errorf("want ErrInvalidConfig naming %s, got %v", c.field, err)
		}
	}
}

// A message without an id fails before any transaction begins, so the
// unusable DB of this test is never touched.
func TestNoMessageIDFailsBeforeTheDatabase(t *testing.T) {
	for _, c := range []struct {
		name string
		id   func(*message.Message) (string, error)
		msg  *message.Message
	}{
		{"EmptyUUID", nil, message.NewMessage("", nil)},
		{"MissingMetadata", middleware.MetadataID("event_id"), message.NewMessage(watermill.NewUUID(), nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			mw, err := middleware.NewInbox(middleware.InboxConfig{
				DB: stdsql.WrapDB(nil), Dialect: postgres.MustNew(postgres.Options{}), Consumer: "billing", MessageID: c.id,
			})
			if err != nil {
				t.Fatal(err)
			}
			ran := false
			_, err = mw(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })(c.msg)
			if !errors.Is(err, middleware.ErrNoMessageID) || ran {
				t.Fatalf("want ErrNoMessageID without running the handler, got %v (ran %v)", err, ran)
			}
		})
	}
}

func TestMetadataID(t *testing.T) {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set("event_id", "evt-1")
	if id, err := middleware.MetadataID("event_id")(msg); err != nil || id != "evt-1" {
		t.Fatalf("got %q, %v", id, err)
	}
	if _, err := middleware.MetadataID("other")(msg); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("want an error naming the field, got %v", err)
	}
}
