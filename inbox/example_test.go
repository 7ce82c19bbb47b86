package inbox_test

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Keep inbox rows for 30 days, because the topic keeps messages for 21.
func ExampleNewCleaner() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://localhost/app")
	dialect, _ := postgres.New(postgres.Options{})

	cleaner, err := inbox.NewCleaner(inbox.CleanerConfig{
		DB:        pgxv5.WrapPool(pool),
		Dialect:   dialect,
		Retention: 30 * 24 * time.Hour,
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = cleaner.Run(ctx) }()
	defer cleaner.Close()
	// ... the application runs ...
}

// Record a message inside the transaction that processes it.
func ExampleInbox_Record() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://localhost/app")
	dialect, _ := postgres.New(postgres.Options{})
	ib, _ := inbox.New(inbox.Config{Dialect: dialect})

	tx, _ := pool.Begin(ctx)
	defer tx.Rollback(ctx)
	first, err := ib.Record(ctx, pgxv5.WrapTx(tx), "billing", "message-uuid")
	if err != nil || !first {
		return // failed, or already processed: nothing to do
	}
	_, _ = tx.Exec(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 1`)
	_ = tx.Commit(ctx)
}
