package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/integration/internal/testlog"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Env returns the environment variable name, or def when it is unset.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// PostgresURL is the Postgres the tests use.
func PostgresURL() string {
	return Env("MILLBOX_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable")
}

// MySQLDSN is the MySQL/MariaDB the tests use.
func MySQLDSN() string {
	return Env("MILLBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true")
}

// AMQPURL is the RabbitMQ the tests use.
func AMQPURL() string { return Env("MILLBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/") }

// InCI reports whether missing services must fail the run.
func InCI() bool { return os.Getenv("CI") != "" && os.Getenv("CI") != "false" }

// Unavailable fails the test in CI and skips it elsewhere.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is required in CI but unreachable: %v", service, err)
	}
	t.Skipf("%s unreachable (%v); start it or set the environment variable (see integration/testenv)", service, err)
}

// UniqueName returns prefix followed by random hex, a valid identifier.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Ctx returns a context that ends with the test, or after timeout.
func Ctx(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Postgres returns a pool to the test Postgres, closed after the test.
func Postgres(t testing.TB) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(PostgresURL())
	if err != nil {
		t.Fatalf("parse MILLBOX_POSTGRES_URL: %v", err)
	}
	if cfg.MaxConns < 20 {
		cfg.MaxConns = 20
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// PostgresSchema creates a fresh schema for the test and drops it after.
func PostgresSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	schema := UniqueName("t_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`); err != nil && !strings.Contains(err.Error(), "closed pool") {
			t.Logf("drop schema %s: %v", schema, err)
		}
	})
	return schema
}

// PostgresDialect returns a migrated Postgres dialect in a fresh schema.
func PostgresDialect(t testing.TB, db sqladapters.DB, pool *pgxpool.Pool, opts postgres.Options) *postgres.Dialect {
	t.Helper()
	opts.Schema = PostgresSchema(t, pool)
	d, err := postgres.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return d
}

// Logger returns a Watermill logger that writes to t's log, shown only
// when t fails (or with -v): give it to every component a test configures
// (forwarder.Config.Logger, cdc.Config.Logger, inbox.CleanerConfig.Logger,
// middleware.InboxConfig.Logger), so that the errors the test provokes on
// purpose stay out of a passing run's output.
func Logger(t testing.TB) watermill.LoggerAdapter { return testlog.Logger(t) }

// LogWriter returns a writer whose lines go to t's log after prefix: for
// the standard output and error of a process the test starts.
func LogWriter(t testing.TB, prefix string) io.Writer { return testlog.Writer(t, prefix) }
