package kafkaid_test

import (
	"database/sql"
	"log"

	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/middleware/kafkaid"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// An inbox that recognizes a redelivered Kafka record by its topic,
// partition and offset, for producers that set no stable message UUID.
func ExampleMessageID() {
	// database/sql with the pgx stdlib driver (or pgxv5.WrapPool of a pgx pool).
	sqlDB, err := sql.Open("pgx", "postgres://app@localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	inboxMW, err := middleware.NewInbox(middleware.InboxConfig{
		DB:        stdsql.WrapDB(sqlDB),
		Dialect:   postgres.MustNew(postgres.Options{}),
		Consumer:  "billing",
		MessageID: kafkaid.MessageID,
	})
	if err != nil {
		log.Fatal(err)
	}
	_ = inboxMW // router.AddMiddleware(..., inboxMW): the last, closest to the handler
}
