// Command river measures millbox next to River (github.com/riverqueue/river),
// the Postgres job queue Go teams use for the same purpose: a job inserted
// with InsertTx in the business transaction, which a worker then publishes.
// It lives in a module of its own so that millbox's module graph never holds
// River.
//
// Three comparisons, chosen with -case, each in one run so that the ratios
// share the machine's state:
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
//   - peers: both as a user runs them, into Kafka (in process, kfake): the
//     business transaction with River's InsertTx or millbox's PublishTx,
//     then a prefilled backlog of the same keyed events drained by River
//     workers that publish each job with watermill-kafka, and by the millbox
//     forwarder with the same publisher, timed until every message was read
//     back from Kafka; each topic is then read back in partition order to
//     count per-key order violations. See peers.go.
//
// Run it from this directory:
//
//	go run . [-case write,drain] [-writers 1,8,32] [-duration 3s] [-n 50000]
//	go run . -case peers [-keys 100] [-rounds 2] [-river-workers 2000]
//
// It prints its results and ends with one summary line of key=value pairs.
// Every ratio named river_vs_millbox is River's throughput divided by
// millbox's: below 1, River is slower. The peers case reports the other way
// round, as millbox's gain over River: write_vs_river and forward_vs_river
// above 1 mean millbox is faster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// options are the command's flags.
type options struct {
	url          string
	cases        []string
	writers      []int
	per          time.Duration
	n            int
	keys         int
	rounds       int
	riverWorkers int
}

func main() {
	var o options
	flag.StringVar(&o.url, "postgres", env("MILLBOX_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL")
	casesFlag := flag.String("case", "write,drain", "comma-separated comparisons to run: write, drain, peers")
	writersFlag := flag.String("writers", "1,8,32", "write, peers: comma-separated counts of concurrent writers (empty = skip the write comparison)")
	flag.DurationVar(&o.per, "duration", 3*time.Second, "write, peers: time per variant and writer count, split into interleaved rounds")
	flag.IntVar(&o.n, "n", 50000, "drain, peers: prefilled events (0 = skip the drain comparison)")
	flag.IntVar(&o.keys, "keys", 100, "peers: ordering keys the events are spread over")
	flag.IntVar(&o.rounds, "rounds", 2, "peers: drains of each side, alternating which goes first")
	flag.IntVar(&o.riverWorkers, "river-workers", riverBenchWorkers, "peers: River's MaxWorkers for the default queue")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := o.parse(*casesFlag, *writersFlag)
	if err == nil {
		err = run(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "river bench:", err)
		os.Exit(1)
	}
}

func (o *options) parse(cases, writers string) error {
	for c := range strings.SplitSeq(cases, ",") {
		switch c = strings.TrimSpace(c); c {
		case "":
		case "write", "drain", "peers":
			o.cases = append(o.cases, c)
		default:
			return fmt.Errorf("-case %q: want write, drain or peers, separated by commas", c)
		}
	}
	if len(o.cases) == 0 {
		return errors.New("-case: nothing to run")
	}
	if o.keys < 1 || o.rounds < 1 || o.riverWorkers < 1 {
		return errors.New("-keys, -rounds and -river-workers must be positive")
	}
	var err error
	o.writers, err = parseWriters(writers)
	return err
}

func run(ctx context.Context, o options) error {
	b, err := setup(ctx, o.url)
	if err != nil {
		return err
	}
	defer b.close()
	var kv []any
	for _, c := range o.cases {
		var pairs []any
		switch {
		case c == "write" && len(o.writers) > 0:
			pairs, err = compareWrites(ctx, b, o.writers, o.per)
		case c == "drain" && o.n > 0:
			pairs, err = compareDrains(ctx, b, o.n)
		case c == "peers":
			pairs, err = comparePeers(ctx, b, o)
		}
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
	orderIDs  atomic.Int64      // the last order row's id, over every comparison
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
