package testenv

import (
	"context"
	"database/sql"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// MySQLDSNWith returns MySQLDSN changed by edit, for example to turn on
// interpolateParams.
func MySQLDSNWith(t testing.TB, edit func(*mysqldrv.Config)) string {
	t.Helper()
	cfg, err := mysqldrv.ParseDSN(MySQLDSN())
	if err != nil {
		t.Fatalf("parse MILLBOX_MYSQL_DSN: %v", err)
	}
	edit(cfg)
	return cfg.FormatDSN()
}

// MySQL returns a pool to the test MySQL/MariaDB, closed after the test.
func MySQL(t testing.TB) *sql.DB { return OpenMySQL(t, MySQLDSN()) }

// OpenMySQL opens dsn with go-sql-driver/mysql, pings it (Unavailable on
// failure) and closes the pool after the test.
func OpenMySQL(t testing.TB, dsn string) *sql.DB {
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
		Unavailable(t, "MySQL/MariaDB", err)
	}
	return db
}

// MySQLNames returns opts with fresh outbox and inbox table names, and
// drops every table they lead to after the test.
func MySQLNames(t testing.TB, db *sql.DB, opts mysql.Options) mysql.Options {
	t.Helper()
	opts.OutboxTable = UniqueName("o_")
	opts.InboxTable = opts.OutboxTable + "_inbox"
	d, err := mysql.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { DropMySQLTables(t, db, d) })
	return opts
}

// DropMySQLTables drops the tables of d, if they exist.
func DropMySQLTables(t testing.TB, db *sql.DB, d *mysql.Dialect) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, table := range d.Tables() {
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+table); err != nil {
			t.Logf("drop table %s: %v", table, err)
		}
	}
}

// MySQLDialect returns a migrated MySQL dialect with fresh table names in
// the connection's database; the tables are dropped after the test.
func MySQLDialect(t testing.TB, db *sql.DB, opts mysql.Options) *mysql.Dialect {
	t.Helper()
	d, err := mysql.New(MySQLNames(t, db, opts))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqladapters.Migrate(ctx, stdsql.WrapDB(db), d); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}
