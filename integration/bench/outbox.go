package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// benchOutbox opens the database -db names, creates a fresh millbox outbox
// in it and returns a cleanup that drops it.
func benchOutbox(ctx context.Context, o options) (sqladapters.DB, sqladapters.Dialect, func(), error) {
	switch o.db {
	case "postgres":
		pool, d, cleanup, err := pgOutbox(ctx, o.pgURL)
		if err != nil {
			return nil, nil, nil, err
		}
		return pgxv5.WrapPool(pool), d, cleanup, nil
	case "mysql":
		return mysqlOutbox(ctx, o.mysqlDSN)
	}
	return nil, nil, nil, fmt.Errorf("-db %q: want postgres or mysql", o.db)
}

// mysqlBenchConns is the connection pool size of mysqlOutbox.
const mysqlBenchConns = 32

// mysqlOutbox opens dsn with interpolateParams, creates a fresh millbox
// installation in its database and returns a cleanup that drops it.
func mysqlOutbox(ctx context.Context, dsn string) (sqladapters.DB, sqladapters.Dialect, func(), error) {
	if !strings.Contains(dsn, "interpolateParams") {
		dsn += map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")] + "interpolateParams=true"
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	db.SetMaxOpenConns(mysqlBenchConns)
	db.SetMaxIdleConns(mysqlBenchConns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, nil, nil, fmt.Errorf("mysql unreachable at %s: %w", dsn, err)
	}
	name := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	wrapped := stdsql.WrapDB(db)
	skip, err := mysql.DetectSkipLocked(ctx, wrapped)
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	d, err := mysql.New(mysql.Options{OutboxTable: name, InboxTable: name + "_inbox", SkipLocked: skip})
	if err != nil {
		db.Close()
		return nil, nil, nil, err
	}
	cleanup := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, t := range d.Tables() {
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t)
		}
		db.Close()
	}
	if err := sqladapters.Migrate(ctx, wrapped, d); err != nil {
		cleanup()
		return nil, nil, nil, err
	}
	return wrapped, d, cleanup, nil
}
