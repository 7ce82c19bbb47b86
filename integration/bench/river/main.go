// Command river measures millbox next to River (github.com/riverqueue/river),
// the Postgres job queue Go teams use for the same purpose: a job inserted
// with InsertTx in the business transaction, which a worker then publishes.
// It lives in a module of its own so that millbox's module graph never holds
// River.
//
// Two comparisons, each in one run so that the ratios share the machine's
// state:
//
//   - write: concurrent writers loop BEGIN, insert one order row, [variant],
//     COMMIT. Variants: bare; millbox with one 256-byte message (default
//     dialect options); the same with postgres.Options.Notify; SELECT 1 (the
//     floor of any extra statement); River's InsertTx of one job with a
//     256-character payload.
//   - drain: n prefilled events published to a Watermill publisher that
//     drops them, by River workers (tuned as River's own benchmark tunes
//     them) and by the millbox forwarder (defaults), timed until every row
//     is settled: River's jobs completed, millbox's rows deleted.
//
// Run it from this directory:
//
//	go run . [-writers 1,8,32] [-duration 3s] [-n 50000]
//
// It prints its results and ends with one summary line of key=value pairs.
// Every ratio named river_vs_millbox is River's throughput divided by
// millbox's: below 1, River is slower.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func main() {
	url := flag.String("postgres", env("MILLBOX_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL")
	writersFlag := flag.String("writers", "1,8,32", "comma-separated counts of concurrent writers (empty = skip the write comparison)")
	per := flag.Duration("duration", 3*time.Second, "write: time per variant and writer count, split into interleaved rounds")
	n := flag.Int("n", 50000, "drain: prefilled events (0 = skip the drain comparison)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *url, *writersFlag, *per, *n); err != nil {
		fmt.Fprintln(os.Stderr, "river bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, url, writersFlag string, per time.Duration, n int) error {
	writers, err := parseWriters(writersFlag)
	if err != nil {
		return err
	}
	b, err := setup(ctx, url)
	if err != nil {
		return err
	}
	defer b.close()
	var kv []any
	if len(writers) > 0 {
		pairs, err := compareWrites(ctx, b, writers, per)
		if err != nil {
			return err
		}
		kv = append(kv, pairs...)
	}
	if n > 0 {
		pairs, err := compareDrains(ctx, b, n)
		if err != nil {
			return err
		}
		kv = append(kv, pairs...)
	}
	summary(kv...)
	return nil
}

// bench is one installation of both: River's tables and millbox's outbox
// in one schema of their own, with an orders table beside them.
type bench struct {
	url       string
	pool      *pgxpool.Pool
	schema    string
	millbox   *postgres.Dialect // default options
	notifying *postgres.Dialect // the same table, with Notify
}

func setup(ctx context.Context, url string) (*bench, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres unreachable at %s: %w", url, err)
	}
	b := &bench{url: url, pool: pool, schema: fmt.Sprintf("bench_river_%d", time.Now().UnixNano())}
	if err := b.migrate(ctx); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) migrate(ctx context.Context) error {
	if _, err := b.pool.Exec(ctx, `CREATE SCHEMA "`+b.schema+`"`); err != nil {
		return err
	}
	if _, err := b.pool.Exec(ctx, `CREATE TABLE "`+b.schema+`".orders (id bigint PRIMARY KEY, customer text NOT NULL, amount bigint NOT NULL)`); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(b.pool), &rivermigrate.Config{Schema: b.schema})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if b.millbox, err = postgres.New(postgres.Options{Schema: b.schema}); err != nil {
		return err
	}
	if err := sqladapters.Migrate(ctx, pgxv5.WrapPool(b.pool), b.millbox); err != nil {
		return fmt.Errorf("millbox migrations: %w", err)
	}
	b.notifying, err = postgres.New(postgres.Options{Schema: b.schema, Notify: true})
	return err
}

// close drops the schema, and with it every table of the run.
func (b *bench) close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _ = b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+b.schema+`" CASCADE`)
	b.pool.Close()
}

func parseWriters(s string) ([]int, error) {
	var ws []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		w, err := strconv.Atoi(f)
		if err != nil || w < 1 {
			return nil, fmt.Errorf("-writers %q: want positive counts separated by commas", s)
		}
		ws = append(ws, w)
	}
	return ws, nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// summary prints the last line: key=value pairs in the given order.
func summary(kv ...any) {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		if i > 0 {
			b.WriteByte(' ')
		}
		switch v := kv[i+1].(type) {
		case float64:
			fmt.Fprintf(&b, "%s=%.2f", kv[i], v)
		default:
			fmt.Fprintf(&b, "%s=%v", kv[i], v)
		}
	}
	fmt.Println(b.String())
}
