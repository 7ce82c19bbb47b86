package modernc_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// overclaiming fails its first call with a PartialError that claims every
// message delivered, against PartialError's contract, then delivers.
type overclaiming struct {
	calls     atomic.Int32
	delivered chan string
}

func (p *overclaiming) Publish(_ string, msgs ...*message.Message) error {
	if p.calls.Add(1) == 1 {
		return &forwarder.PartialError{Delivered: len(msgs), Err: errors.New("broker said no")}
	}
	for _, m := range msgs {
		p.delivered <- m.UUID
	}
	return nil
}

func (p *overclaiming) Close() error { return nil }

// A PartialError claiming the whole call counts as nothing delivered, as
// DeliveredPrefix reads it: the message is retried, not dropped, and the
// forwarder keeps running.
func TestPartialErrorClaimingEverythingIsRetried(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	sqlDB, err := modernc.Open(filepath.Join(t.TempDir(), "app.db"), modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	db, dialect := stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		t.Fatal(err)
	}
	pub := &overclaiming{delivered: make(chan string, 10)}
	fwd, err := forwarder.New(forwarder.Config{
		DB:                  db,
		Dialect:             dialect,
		Destination:         pub,
		Retry:               forwarder.ExponentialRetry{Min: time.Millisecond, Max: 10 * time.Millisecond},
		DelayedPollInterval: 10 * time.Millisecond,
		Source:              forwarder.Polling{PollInterval: 10 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- fwd.Run(ctx) }()
	defer func() { fwd.Close(); <-runErr }()
	if err := fwd.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := sqlDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.PublishTx(ctx, stdsql.WrapTx(tx), "t", message.NewMessage("m1", nil)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-pub.delivered:
		if id != "m1" {
			t.Fatalf("delivered %s, want m1", id)
		}
	case err := <-runErr:
		t.Fatalf("forwarder stopped: %v", err)
	case <-ctx.Done():
		t.Fatal("the message was never delivered after the overclaiming failure")
	}
	if pub.calls.Load() < 2 {
		t.Fatalf("%d calls, want a retry", pub.calls.Load())
	}
}
