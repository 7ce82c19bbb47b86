package ops_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Inspect the rows that exhausted their attempts, then send those that
// failed on a broker outage again.
func ExampleOps_ListDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	o, err := ops.New(pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{}))
	if err != nil {
		log.Fatal(err)
	}

	outage := ops.Filter{ErrorContains: "connection refused"}
	for q := (ops.ListQuery{Filter: outage}); ; {
		page, err := o.ListDeadLetters(ctx, q)
		if err != nil {
			log.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			log.Printf("dead: %s to %s after %d attempts: %s", d.UUID, d.Topic, d.Attempts, d.LastError)
		}
		q.AfterID = page[len(page)-1].ID
	}
	n, err := o.Requeue(ctx, outage, ops.ChangeOptions{})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("requeued %d rows", n)
}
