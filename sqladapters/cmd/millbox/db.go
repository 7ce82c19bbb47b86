package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// dsnForms lists the accepted --dsn forms, for help and errors.
const dsnForms = `  postgres://user:password@host:5432/db?sslmode=disable   PostgreSQL (also postgresql://, or host=... dbname=...)
  mysql://user:password@tcp(host:3306)/db                  MySQL or MariaDB (also mysql://user:password@host:3306/db)
  user:password@tcp(host:3306)/db                          MySQL or MariaDB (a go-sql-driver/mysql DSN)
  sqlite:///var/lib/app/app.db or sqlite://app.db          SQLite file (also file:app.db)`

// pgKeywordValue matches libpq's keyword/value form: host=db user=app ...
var pgKeywordValue = regexp.MustCompile(`^\s*(host|hostaddr|dbname|user|port|sslmode|service)\s*=`)

// errBadDSN marks a --dsn that is missing or not understood.
var errBadDSN = errors.New("bad --dsn")

// target is a parsed --dsn: which database, and how to reach it.
type target struct {
	kind  string // "postgres", "mysql" or "sqlite"
	pg    *pgxpool.Config
	my    *mysqldrv.Config
	path  string // SQLite file
	where string // the server or file, without credentials, for messages
}

// parseDSN recognizes the database from the form of dsn.
func parseDSN(dsn string) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, fmt.Errorf("%w: %s\naccepted forms:\n%s", errBadDSN, fmt.Sprintf(format, args...), dsnForms)
	}
	lower := strings.ToLower(dsn)
	switch {
	case dsn == "":
		return bad("no database given: pass --dsn or set MILLBOX_DSN")
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"), pgKeywordValue.MatchString(dsn):
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return bad("PostgreSQL URL: %v", redactErr(err, dsn))
		}
		cfg.MaxConns = 4
		where := net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port)) + "/" + cfg.ConnConfig.Database
		return target{kind: "postgres", pg: cfg, where: where}, nil
	case strings.HasPrefix(lower, "mysql://"):
		rest := dsn[len("mysql://"):]
		if rest == "" {
			return bad("mysql:// names no server")
		}
		cfg, err := mysqldrv.ParseDSN(rest)
		if err != nil {
			cfg, err = mysqlURL(dsn)
		}
		if err != nil {
			return bad("MySQL DSN: %v", err)
		}
		return mysqlTarget(cfg), nil
	case strings.HasPrefix(lower, "sqlite://"):
		return sqliteTarget(dsn[len("sqlite://"):])
	case strings.HasPrefix(lower, "file:"):
		return sqliteTarget(dsn[len("file:"):])
	}
	if strings.Contains(dsn, "://") {
		return bad("unknown scheme in %q", dsn[:strings.Index(dsn, "://")+3])
	}
	if strings.Contains(dsn, "@") || strings.Contains(dsn, "(") {
		cfg, err := mysqldrv.ParseDSN(dsn)
		if err != nil {
			return bad("MySQL DSN: %v", err)
		}
		return mysqlTarget(cfg), nil
	}
	return bad("cannot tell the database from %q", dsn)
}

// mysqlURL reads mysql://user:password@host:port/db?params.
func mysqlURL(dsn string) (*mysqldrv.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, errors.New("neither a go-sql-driver/mysql DSN after mysql:// nor a URL")
	}
	if u.Host == "" {
		return nil, errors.New("no host")
	}
	cfg := mysqldrv.NewConfig()
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = net.JoinHostPort(u.Hostname(), "3306")
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if q := u.RawQuery; q != "" {
		// Let the driver read the parameters as it reads them in a DSN.
		parsed, err := mysqldrv.ParseDSN(cfg.FormatDSN() + "?" + q)
		if err != nil {
			return nil, err
		}
		cfg = parsed
	}
	return cfg, nil
}

func mysqlTarget(cfg *mysqldrv.Config) target {
	// The dialects scan DATETIME columns into time.Time, and the columns
	// hold UTC.
	cfg.ParseTime = true
	cfg.Loc = time.UTC
	return target{kind: "mysql", my: cfg, where: cfg.Addr + "/" + cfg.DBName}
}

func sqliteTarget(path string) (target, error) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if path == "" || path == ":memory:" {
		return target{}, fmt.Errorf("%w: SQLite needs a database file path\naccepted forms:\n%s", errBadDSN, dsnForms)
	}
	return target{kind: "sqlite", path: path, where: path}, nil
}

// redactErr keeps a password in dsn out of an error message.
func redactErr(err error, dsn string) string {
	msg := err.Error()
	if u, perr := url.Parse(dsn); perr == nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// tableFlags are the --schema and table-name flags, and the layout
// 'migrate' creates.
type tableFlags struct {
	schema, outbox, inbox string
	// partitioned, for 'migrate' on Postgres, creates the time-partitioned
	// outbox (postgres.Options.Partitioned).
	partitioned *postgres.PartitionOptions
	// withoutInbox, for 'migrate', leaves the inbox table out.
	withoutInbox bool
}

// dialect builds the dialect of kind with the table flags.
func (f tableFlags) dialect(kind string) (sqladapters.Dialect, error) {
	switch kind {
	case "postgres":
		return postgres.New(postgres.Options{Schema: f.schema, OutboxTable: f.outbox, InboxTable: f.inbox, Partitioned: f.partitioned, WithoutInbox: f.withoutInbox})
	}
	if f.partitioned != nil {
		return nil, fmt.Errorf("--partitioned applies to PostgreSQL only, not %s", kind)
	}
	switch kind {
	case "mysql":
		return mysql.New(mysql.Options{Database: f.schema, OutboxTable: f.outbox, InboxTable: f.inbox, WithoutInbox: f.withoutInbox})
	case "sqlite":
		if f.schema != "" {
			return nil, errors.New("--schema does not apply to SQLite: one file is one database")
		}
		return sqlite.New(sqlite.Options{OutboxTable: f.outbox, InboxTable: f.inbox, WithoutInbox: f.withoutInbox})
	}
	return nil, fmt.Errorf("unknown database %q: want postgres, mysql or sqlite", kind)
}

// conn is an open database.
type conn struct {
	db    sqladapters.DB
	close func()
}

// errUnreachable marks a database that could not be reached.
var errUnreachable = errors.New("cannot reach the database")

// open connects to t and checks the connection within timeout. create says
// whether a missing SQLite file may be created.
func open(ctx context.Context, t target, timeout time.Duration, create bool) (*conn, error) {
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch t.kind {
	case "postgres":
		pool, err := pgxpool.NewWithConfig(pctx, t.pg)
		if err == nil {
			err = pool.Ping(pctx)
			if err != nil {
				pool.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: PostgreSQL at %s: %v", errUnreachable, t.where, err)
		}
		return &conn{db: pgxv5.WrapPool(pool), close: pool.Close}, nil
	case "mysql":
		db, err := sql.Open("mysql", t.my.FormatDSN())
		if err == nil {
			db.SetMaxOpenConns(4)
			err = db.PingContext(pctx)
			if err != nil {
				db.Close()
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: MySQL at %s: %v", errUnreachable, t.where, err)
		}
		return &conn{db: stdsql.WrapDB(db), close: func() { db.Close() }}, nil
	case "sqlite":
		if !create {
			if _, err := os.Stat(t.path); err != nil {
				return nil, fmt.Errorf("%w: SQLite file %s: %v (create it and the tables with `millbox migrate up`)", errUnreachable, t.path, err)
			}
		}
		db, err := modernc.Open(t.path, modernc.Config{})
		if err != nil {
			return nil, fmt.Errorf("%w: SQLite file %s: %v", errUnreachable, t.path, err)
		}
		return &conn{db: stdsql.WrapDB(db), close: func() { db.Close() }}, nil
	}
	return nil, fmt.Errorf("unknown database %q", t.kind)
}
