package modernc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// middleware.NewInbox on SQLite: a message delivered twice is handled once:
// the handler's write and the inbox record commit together, and the
// redelivery finds the record. The middleware is applied to a handler
// directly here; in a router it is router.AddMiddleware(inboxMW). SQLite, so
// the example runs anywhere.
func Example_inboxMiddleware() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "millbox-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqlDB, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	db, dialect := stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}
	if _, err := sqlDB.ExecContext(ctx, `CREATE TABLE payments (order_id TEXT, cents INTEGER)`); err != nil {
		log.Fatal(err)
	}

	duplicates := 0
	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{
		DB:          db,
		Dialect:     dialect,
		Consumer:    "billing",
		OnDuplicate: func(*message.Message) { duplicates++ },
	})
	if err != nil {
		log.Fatal(err)
	}
	handler := inboxMW(func(msg *message.Message) ([]*message.Message, error) {
		tx, err := stdsql.TxFromContext(msg.Context()) // the inbox's transaction
		if err != nil {
			return nil, err
		}
		_, err = tx.ExecContext(msg.Context(), `INSERT INTO payments (order_id, cents) VALUES ('order-7', 4200)`)
		return nil, err
	})

	for range 2 { // at-least-once delivery: the same message twice
		if _, err := handler(message.NewMessage("payment-1", nil)); err != nil {
			log.Fatal(err)
		}
	}
	var payments int
	if err := sqlDB.QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&payments); err != nil {
		log.Fatal(err)
	}
	fmt.Println("payments:", payments, "duplicates skipped:", duplicates)
	// Output: payments: 1 duplicates skipped: 1
}
