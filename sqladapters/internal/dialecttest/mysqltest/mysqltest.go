// Package mysqltest connects tests to the MySQL or MariaDB server named by
// MILLBOX_MYSQL_DSN (default root@tcp(127.0.0.1:3306)/test?parseTime=true)
// and gives each test tables of its own, dropped afterwards.
package mysqltest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// DSNVariable is the environment variable that holds the server's DSN.
const DSNVariable = "MILLBOX_MYSQL_DSN"

// DSN is the server the tests use.
func DSN() string {
	return dialecttest.Env(DSNVariable, "root@tcp(127.0.0.1:3306)/test?parseTime=true")
}

// DSNWith returns DSN changed by edit, for example to turn on
// interpolateParams.
func DSNWith(t testing.TB, edit func(*mysqldrv.Config)) string {
	t.Helper()
	cfg, err := mysqldrv.ParseDSN(DSN())
	if err != nil {
		t.Fatalf("parse %s: %v", DSNVariable, err)
	}
	edit(cfg)
	return cfg.FormatDSN()
}

// DB returns a pool to the server at DSN, closed after the test.
func DB(t testing.TB) *sql.DB {
	t.Helper()
	return Open(t, DSN())
}

// Open opens dsn, pings it (see dialecttest.Unavailable for a failure) and
// closes the pool after the test.
func Open(t testing.TB, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("open MySQL: %v", err)
	}
	db.SetMaxOpenConns(20)
	db.SetMaxIdleConns(20)
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		dialecttest.Unavailable(t, "MySQL/MariaDB", DSNVariable, err)
	}
	return db
}

// Names returns opts with fresh outbox and inbox table names, and drops
// every table they lead to after the test.
func Names(t testing.TB, db *sql.DB, opts mysql.Options) mysql.Options {
	t.Helper()
	opts.OutboxTable = dialecttest.UniqueName("o_")
	opts.InboxTable = opts.OutboxTable + "_inbox"
	d, err := mysql.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range d.Tables() {
			if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
				t.Logf("drop table %s: %v", table, err)
			}
		}
	})
	return opts
}

// Dialect returns a migrated dialect with fresh table names in the
// connection's database; the tables are dropped after the test.
func Dialect(t testing.TB, db *sql.DB, opts mysql.Options) *mysql.Dialect {
	t.Helper()
	d := Fresh(t, db, opts)
	dialecttest.Migrate(t, stdsql.WrapDB(db), d)
	return d
}

// Fresh returns a dialect with fresh table names, not migrated; the tables,
// if anything creates them, are dropped after the test.
func Fresh(t testing.TB, db *sql.DB, opts mysql.Options) *mysql.Dialect {
	t.Helper()
	d, err := mysql.New(Names(t, db, opts))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// FreshFleet returns a fleet store whose tables have a fresh prefix, not
// migrated; the tables, if anything creates them, are dropped after the
// test.
func FreshFleet(t testing.TB, db *sql.DB, opts mysql.FleetOptions) *mysql.Fleet {
	t.Helper()
	opts.Prefix = dialecttest.UniqueName("f_")
	f, err := mysql.NewFleet(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, table := range f.Tables() {
			if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
				t.Logf("drop table %s: %v", table, err)
			}
		}
	})
	return f
}
