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
	"github.com/jackc/pgx/v5/pgconn"
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
const dsnForms = `  postgres://user:password@host:5432/db?sslmode=disable   PostgreSQL (also postgresql://)
  host=db user=app password=secret dbname=app               PostgreSQL (libpq keyword=value, any keyword first)
  mysql://user:password@tcp(host:3306)/db                  MySQL or MariaDB (also mysql://user:password@host:3306/db)
  user:password@tcp(host:3306)/db                          MySQL or MariaDB (a go-sql-driver/mysql DSN)
  sqlite:///var/lib/app/app.db or sqlite://app.db          SQLite file (also file:app.db)`

// pgKeywordValue matches libpq's keyword/value form: a keyword, then =.
var pgKeywordValue = regexp.MustCompile(`^\s*[A-Za-z_][A-Za-z0-9_]*\s*=`)

// urlScheme matches the scheme of a URL.
var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*://`)

// errBadDSN marks a --dsn that is missing or not understood. Its message
// never holds the DSN, which may hold a password.
var errBadDSN = errors.New("bad --dsn")

// target is a parsed --dsn: which database, and how to reach it.
type target struct {
	kind  string // "postgres", "mysql" or "sqlite"
	pg    *pgxpool.Config
	my    *mysqldrv.Config
	path  string // SQLite file
	where string // the server or file, without credentials, for messages
}

// parseDSN recognizes the database from the form of dsn and parses it
// with the driver's own parser: pgx for PostgreSQL URLs and every libpq
// keyword/value list, go-sql-driver/mysql for MySQL DSNs. Its errors
// never repeat dsn.
func parseDSN(dsn string) (target, error) {
	bad := func(format string, args ...any) (target, error) {
		return target{}, fmt.Errorf("%w: %s\naccepted forms:\n%s", errBadDSN, fmt.Sprintf(format, args...), dsnForms)
	}
	lower := strings.ToLower(dsn)
	switch {
	case strings.TrimSpace(dsn) == "":
		return bad("no database given: pass --dsn or set MILLBOX_DSN")
	case strings.HasPrefix(lower, "postgres://"), strings.HasPrefix(lower, "postgresql://"), pgKeywordValue.MatchString(dsn):
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return bad("not a PostgreSQL connection string pgx can read: %s", pgParseProblem(err))
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
	case urlScheme.MatchString(dsn):
		return bad("unknown scheme %s", urlScheme.FindString(dsn))
	case strings.Contains(dsn, "://"):
		return bad("not a URL of a known database")
	}
	cfg, err := mysqldrv.ParseDSN(dsn)
	if err != nil {
		return bad("cannot tell the database: not a URL, not a libpq keyword=value list, and not a MySQL DSN (%v)", err)
	}
	return mysqlTarget(cfg), nil
}

// pgParseProblem is what pgx found wrong, without the connection string:
// pgx's message names it with the password masked at best, and the error
// of Go's URL parser names it whole.
func pgParseProblem(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "unreadable"
	}
	blank := *pe
	blank.ConnString = ""
	msg := strings.TrimPrefix(blank.Error(), "cannot parse ``: ")
	var ue *url.Error
	if errors.As(pe, &ue) {
		msg = strings.Replace(msg, ue.Error(), ue.Err.Error(), 1)
	}
	return msg
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
			return nil, errors.New("the URL's parameters are not those of a go-sql-driver/mysql DSN")
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

// open connects to t and checks the connection within the connect
// timeout. create says whether a missing SQLite file may be created.
func (c *common) open(ctx context.Context, t target, create bool) (*conn, error) {
	pctx, cancel := context.WithTimeout(ctx, c.timeout)
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
				return nil, fmt.Errorf("%w: SQLite file %s: %v (create it and the tables with: %s)", errUnreachable, t.path, err, c.hint("migrate up"))
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
