package modernc_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// ops.New on SQLite: read the backlog, then requeue the dead letters that
// failed on a broker outage once it is over.
func Example_ops() {
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
	ctx := context.Background()
	db, dialect := stdsql.WrapDB(sdb), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}

	o, err := ops.New(db, dialect)
	if err != nil {
		log.Fatal(err)
	}
	st, err := o.Status(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pending:", st.Pending, "dead letters:", st.DeadLetters)

	outage := ops.Filter{ErrorContains: "connection refused"}
	n, err := o.CountDeadLetters(ctx, outage)
	if err != nil {
		log.Fatal(err)
	}
	if n > 0 {
		if _, err := o.Requeue(ctx, outage, ops.ChangeOptions{}); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println("requeued:", n)
	// Output:
	// pending: 0 dead letters: 0
	// requeued: 0
}
