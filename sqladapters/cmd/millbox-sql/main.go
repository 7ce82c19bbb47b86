package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
)

func main() {
	db := flag.String("db", "postgres", "database: postgres, mysql or sqlite")
	schema := flag.String("schema", "", "Postgres schema, or MySQL database (default: unqualified names)")
	outbox := flag.String("outbox", "", "outbox table name (default millbox_outbox)")
	inboxTable := flag.String("inbox", "", "inbox table name (default millbox_inbox)")
	flag.Parse()
	d, err := dialect(*db, *schema, *outbox, *inboxTable)
	if err != nil {
		fmt.Fprintln(os.Stderr, "millbox-sql:", err)
		os.Exit(2)
	}
	fmt.Print(sqladapters.MigrationSQL(d))
}

func dialect(db, schema, outbox, inbox string) (sqladapters.Dialect, error) {
	switch db {
	case "postgres":
		return postgres.New(postgres.Options{Schema: schema, OutboxTable: outbox, InboxTable: inbox})
	case "mysql":
		return mysql.New(mysql.Options{Database: schema, OutboxTable: outbox, InboxTable: inbox})
	case "sqlite":
		if schema != "" {
			return nil, fmt.Errorf("-schema is not supported for sqlite")
		}
		return sqlite.New(sqlite.Options{OutboxTable: outbox, InboxTable: inbox})
	}
	return nil, fmt.Errorf("-db %q: want postgres, mysql or sqlite", db)
}
