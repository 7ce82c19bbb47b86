package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // registers "mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // registers "pgx"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// database holds the orders and the millbox tables. The quickstart talks
// to all three databases through database/sql, so one handler serves them
// all. Forwarders in other processes find new rows within milliseconds by
// watching the outbox's id sequence (forwarder.Polling.WatchInterval).
type database struct {
	name     string
	sql      *sql.DB
	dialect  sqladapters.Dialect
	orders   string // the orders table, quoted
	postgres bool   // $1 placeholders instead of ?
	drop     []string
	dir      string // SQLite's temporary directory
}

func openDatabase(ctx context.Context, o options, suffix string) (*database, error) {
	var db *database
	var err error
	switch {
	case o.postgres != "":
		db, err = openPostgres(o.postgres, suffix)
	case o.mysql != "":
		db, err = openMySQL(ctx, o.mysql, suffix)
	default:
		db, err = openSQLite()
	}
	if err != nil {
		return nil, err
	}
	// Create (or upgrade) the outbox, lease and inbox tables. Safe to run
	// from every instance at start-up; sqladapters.MigrationSQL prints the
	// same schema for migration tools instead.
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(db.sql), db.dialect); err != nil {
		db.cleanup()
		return nil, fmt.Errorf("migrate %s: %w", db.name, err)
	}
	// The application's own table. times_shipped counts how often the
	// consumer applied an order's event: exactly once is the goal.
	_, err = db.sql.ExecContext(ctx, `CREATE TABLE `+db.orders+` (
		id VARCHAR(64) PRIMARY KEY,
		customer VARCHAR(64) NOT NULL,
		total_cents BIGINT NOT NULL,
		times_shipped INTEGER NOT NULL DEFAULT 0)`)
	if err != nil {
		db.cleanup()
		return nil, fmt.Errorf("create orders table: %w", err)
	}
	return db, nil
}

func openSQLite() (*database, error) {
	dir, err := os.MkdirTemp("", "millbox-quickstart-")
	if err != nil {
		return nil, err
	}
	// modernc.Open sets WAL, a busy timeout and BEGIN IMMEDIATE on every
	// pooled connection: see package sqladapters/sqlite for why.
	db, err := modernc.Open(filepath.Join(dir, "quickstart.db"), modernc.Config{})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &database{name: "SQLite", sql: db, dialect: sqlite.MustNew(sqlite.Options{}), orders: "orders", dir: dir}, nil
}

func openPostgres(url, suffix string) (*database, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, err
	}
	// Everything goes into a schema of its own; Migrate creates it.
	schema := "millbox_quickstart_" + suffix
	d, err := postgres.New(postgres.Options{Schema: schema})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &database{
		name: "PostgreSQL", sql: db, dialect: d, postgres: true,
		orders: `"` + schema + `".orders`,
		drop:   []string{`DROP SCHEMA IF EXISTS "` + schema + `" CASCADE`},
	}, nil
}

// openMySQL opens MySQL or MariaDB with go-sql-driver/mysql. The DSN needs
// parseTime=true (the dead-letter API reads DATETIME columns into
// time.Time); interpolateParams=true saves a round trip per statement.
func openMySQL(ctx context.Context, dsn string, suffix string) (*database, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	// FOR UPDATE SKIP LOCKED exists from MySQL 8.0.1 and MariaDB 10.6.
	skipLocked, err := mysql.DetectSkipLocked(ctx, stdsql.WrapDB(db))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("connect to MySQL: %w", err)
	}
	prefix := "quickstart_" + suffix
	d, err := mysql.New(mysql.Options{OutboxTable: prefix + "_outbox", InboxTable: prefix + "_inbox", SkipLocked: skipLocked})
	if err != nil {
		db.Close()
		return nil, err
	}
	orders := "`" + prefix + "_orders`"
	drop := []string{`DROP TABLE IF EXISTS ` + orders}
	for _, t := range d.Tables() {
		drop = append(drop, `DROP TABLE IF EXISTS `+t)
	}
	return &database{name: "MySQL", sql: db, dialect: d, orders: orders, drop: drop}, nil
}

// q turns ? placeholders into Postgres' $1, $2, ...
func (db *database) q(query string) string {
	if !db.postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// shipped counts the orders shipped exactly once, and the others.
func (db *database) shipped(ctx context.Context) (once, other int, err error) {
	err = db.sql.QueryRowContext(ctx, `SELECT
		COALESCE(SUM(CASE WHEN times_shipped = 1 THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN times_shipped <> 1 THEN 1 ELSE 0 END), 0)
		FROM `+db.orders).Scan(&once, &other)
	return once, other, err
}

// cleanup drops what the run created and closes the database.
func (db *database) cleanup() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, stmt := range db.drop {
		if _, err := db.sql.ExecContext(ctx, stmt); err != nil {
			fmt.Fprintln(os.Stderr, "cleanup:", err)
		}
	}
	db.sql.Close()
	if db.dir != "" {
		os.RemoveAll(db.dir)
	}
}
