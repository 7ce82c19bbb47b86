package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strings"
	"time"
)

// options are the flags every case may use.
type options struct {
	n        int
	duration time.Duration
	db       string
	pgURL    string
	mysqlDSN string
	amqpURL  string
	// forwarder tuning, 0 = millbox's defaults
	batch, concurrency int
	// forwarder instances sharing the outbox in the forward case
	instances int
	// rounds of cases that alternate two sides, 0 = the case's default
	rounds int
	// dead letters hold their keys (forwarder.Config.DeadLetterHoldsKey)
	hold bool
	// RabbitMQ publisher channel pool, 0 = the bench's default
	channels int
	// destination of the forward case: kafka, nats or redis
	dest      string
	natsURL   string
	redisAddr string
}

type benchCase struct {
	about string
	run   func(ctx context.Context, o options) error
}

var cases = map[string]benchCase{}

func register(name, about string, run func(ctx context.Context, o options) error) {
	cases[name] = benchCase{about: about, run: run}
}

func main() {
	var o options
	name := flag.String("case", "", "benchmark case to run (see below)")
	flag.IntVar(&o.n, "n", 0, "number of messages or iterations (0 = the case's default)")
	flag.DurationVar(&o.duration, "duration", 0, "duration for time-based cases (0 = the case's default)")
	flag.StringVar(&o.db, "db", "postgres", "database: postgres or mysql")
	flag.StringVar(&o.pgURL, "postgres", env("MILLBOX_POSTGRES_URL", "postgres://root@127.0.0.1:5432/test?sslmode=disable"), "Postgres URL")
	flag.StringVar(&o.mysqlDSN, "mysql", env("MILLBOX_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test?parseTime=true"), "MySQL DSN")
	flag.StringVar(&o.amqpURL, "amqp", env("MILLBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.IntVar(&o.batch, "batch", 0, "millbox forwarder BatchSize (0 = default)")
	flag.IntVar(&o.concurrency, "concurrency", 0, "millbox forwarder Concurrency (0 = default)")
	flag.BoolVar(&o.hold, "hold", false, "forward-noop: dead letters hold their keys (forwarder.Config.DeadLetterHoldsKey)")
	flag.IntVar(&o.instances, "instances", 1, "forward: millbox forwarders sharing the outbox (they split its partitions)")
	flag.IntVar(&o.rounds, "rounds", 0, "instances: rounds of the two sides (0 = the case's default)")
	flag.IntVar(&o.channels, "channels", 0, "RabbitMQ publisher channel pool size (0 = 64)")
	flag.StringVar(&o.dest, "dest", "kafka", "forward: destination, kafka (kfake), nats (JetStream) or redis (streams)")
	flag.StringVar(&o.natsURL, "nats", env("MILLBOX_NATS_URL", "nats://127.0.0.1:4222"), "NATS URL (JetStream enabled)")
	flag.StringVar(&o.redisAddr, "redis", env("MILLBOX_REDIS_ADDR", "127.0.0.1:6379"), "Redis address")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./integration/bench -case NAME [flags]\n\ncases:\n")
		names := make([]string, 0, len(cases))
		for n := range cases {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			fmt.Fprintf(flag.CommandLine.Output(), "  %-12s %s\n", n, cases[n].about)
		}
		fmt.Fprintf(flag.CommandLine.Output(), "\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	c, ok := cases[*name]
	if !ok {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if err := c.run(ctx, o); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintf(os.Stderr, "bench %s: %v\n", *name, err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
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
