package modernc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// refusing is a destination that refuses every message, as a broker does
// whose topic is read-only.
type refusing struct{}

func (refusing) Publish(string, ...*message.Message) error {
	return errors.New("topic orders is read-only")
}
func (refusing) Close() error { return nil }

// ops.New on SQLite: a message the destination refused until it became a
// dead letter, found by its error, and requeued once the destination is
// fixed. The millbox command (millbox dead list, millbox dead requeue)
// and the admin page run the same operations.
func Example_ops() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "millbox-ops")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sdb, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer sdb.Close()
	db, dialect := stdsql.WrapDB(sdb), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}

	// An event, and a forwarder that gives it up after its first failed
	// attempt (MaxAttempts: 1; by default after 10, about 8.5 minutes).
	outbox, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: dialect})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := sdb.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := outbox.PublishTx(ctx, stdsql.WrapTx(tx), "orders", message.NewMessage("order-7-placed", []byte(`{}`))); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	fw, err := forwarder.New(forwarder.Config{
		DB:          db,
		Dialect:     dialect,
		Destination: refusing{},
		MaxAttempts: 1,
		Logger:      watermill.NopLogger{}, // by default the failure is logged through log/slog
	})
	if err != nil {
		log.Fatal(err)
	}

	o, err := ops.New(db, dialect)
	if err != nil {
		log.Fatal(err)
	}
	readOnly := ops.Filter{ErrorContains: "read-only"}
	runErr := make(chan error, 1)
	go func() { runErr <- fw.Run(ctx) }()
	for {
		n, err := o.CountDeadLetters(ctx, readOnly)
		if err != nil {
			log.Fatal(err)
		}
		if n > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fw.Close()
	<-runErr

	dead, err := o.ListDeadLetters(ctx, ops.ListQuery{Filter: readOnly})
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range dead {
		fmt.Printf("dead letter %s to %s after %d attempt(s): %s\n", d.UUID, d.Topic, d.Attempts, d.LastError)
	}

	// The topic is writable again: send the dead letters once more.
	n, err := o.Requeue(ctx, readOnly, ops.ChangeOptions{})
	if err != nil {
		log.Fatal(err)
	}
	st, err := o.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("requeued:", n, "pending:", st.Pending, "dead letters:", st.Dead)
	// Output:
	// dead letter order-7-placed to orders after 1 attempt(s): topic orders is read-only
	// requeued: 1 pending: 1 dead letters: 0
}
