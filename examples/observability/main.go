// Observability runs millbox with OpenTelemetry metrics and traces exported
// to Prometheus, and serves the metrics and the health checks.
//
// Each order writes an "OrderPlaced" event into the outbox inside a traced
// request; a forwarder moves the events to Kafka, and a router consumes them
// through the inbox middleware. Along the way some events are delivered
// twice (the inbox skips them) and the events of an "audit" topic always
// fail at the destination, so they end as dead letters: every panel of
// dashboard.json and every rule of alerts.yml has something to show.
//
// With no flags it needs nothing installed: SQLite in a temporary directory
// (PostgreSQL when $MILLBOX_POSTGRES_URL is set) and Kafka served in process
// by franz-go's kfake. It keeps placing orders until interrupted:
//
//	go run ./examples/observability
//	curl -s localhost:9464/metrics | grep -E '^(millbox|messaging)_'
//	curl -s localhost:9464/readyz
//
// With -short it places -n orders, checks the metrics and health endpoints
// itself, and prints a summary a script can check as its last line:
//
//	orders=100 handled=100 traces_continued=100 duplicates_skipped=10 dead_letters=5 ready=true not_ready_after_stop=true metrics=ok
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/middleware"
	"github.com/millbox/millbox/sqladapters"
)

// OrderPlaced is the event committed with each order. TraceID lets the
// consumer check, for this demo only, that it runs in the order's trace.
type OrderPlaced struct {
	OrderID string `json:"order_id"`
	TraceID string `json:"trace_id"`
}

type options struct {
	n        int
	short    bool
	addr     string
	database string
	rate     int
	timeout  time.Duration
}

func main() {
	var o options
	def := "sqlite"
	if os.Getenv("MILLBOX_POSTGRES_URL") != "" {
		def = "postgres"
	}
	flag.BoolVar(&o.short, "short", false, "place -n orders, check the endpoints, print a summary and exit")
	flag.IntVar(&o.n, "n", 100, "orders to place with -short")
	flag.IntVar(&o.rate, "rate", 20, "orders per second without -short")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:9464", "`address` to serve /metrics, /healthz and /readyz on (port 0 with -short)")
	flag.StringVar(&o.database, "db", def, "sqlite, or postgres at $MILLBOX_POSTGRES_URL (the default when it is set)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "with -short, give up waiting after this long")
	flag.Parse()
	if o.database != "sqlite" && o.database != "postgres" {
		fmt.Fprintln(os.Stderr, "observability: -db must be sqlite or postgres")
		os.Exit(2)
	}
	if o.short && o.addr == "127.0.0.1:9464" {
		o.addr = "127.0.0.1:0"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "observability:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	orders, audit := "observability.orders."+suffix, "observability.audit."+suffix

	tel, err := setupTelemetry()
	if err != nil {
		return err
	}
	defer tel.shutdown()

	db, err := openDatabase(ctx, o.database, suffix)
	if err != nil {
		return err
	}
	defer db.cleanup()

	// Kafka: in process (kfake). The default marshaler turns metadata,
	// the stored trace context included, into record headers and back.
	addrs, cleanupKafka, err := exampleenv.StartKafka("")
	if err != nil {
		return err
	}
	defer cleanupKafka(nil, nil)
	kafkaPub, err := kafka.NewPublisher(kafka.PublisherConfig{Brokers: addrs, Marshaler: kafka.DefaultMarshaler{}}, logger)
	if err != nil {
		return err
	}
	defer kafkaPub.Close()
	sub, err := exampleenv.NewKafkaSubscriber(exampleenv.KafkaSubscriberConfig{
		Brokers: addrs, ConsumerGroup: "billing-" + suffix, Topics: []string{orders}, Logger: logger,
	})
	if err != nil {
		return err
	}
	defer sub.Close()

	// The consumer. The inbox middleware continues each event's trace and
	// reports consumed messages and process durations; with no Telemetry
	// set it uses the global providers setupTelemetry installed.
	var handled, continued, duplicates atomic.Int64
	inbox, err := middleware.NewInbox(middleware.InboxConfig{
		DB:          db.wrapped,
		Dialect:     db.dialect,
		Consumer:    "billing",
		Telemetry:   middleware.Telemetry{MessagingSystem: "kafka"},
		OnDuplicate: func(*message.Message) { duplicates.Add(1) },
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return err
	}
	router.AddMiddleware(inbox)
	router.AddConsumerHandler("invoice", orders, sub, func(msg *message.Message) error {
		var ev OrderPlaced
		if err := json.Unmarshal(msg.Payload, &ev); err != nil {
			return err
		}
		if trace.SpanContextFromContext(msg.Context()).TraceID().String() == ev.TraceID {
			continued.Add(1)
		}
		handled.Add(1)
		return nil
	})
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	defer func() {
		_ = router.Close()
		<-routerDone
	}()
	<-router.Running()

	// The forwarder. Its destination delivers every tenth order event
	// twice, as a producer retrying after a lost acknowledgement would,
	// and refuses the audit topic, whose rows end as dead letters after
	// three attempts.
	dest := &demoDestination{Publisher: kafkaPub, failTopic: audit}
	fw, err := forwarder.New(forwarder.Config{
		DB:          db.wrapped,
		Dialect:     db.dialect,
		Destination: dest,
		MaxAttempts: 3,
		Retry:       forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		Logger:      logger,
		// Metrics and send spans go to the global providers that
		// setupTelemetry installed.
		Telemetry: forwarder.Telemetry{MessagingSystem: "kafka"},
	})
	if err != nil {
		return err
	}
	stopForwarder, err := exampleenv.StartForwarder(ctx, fw)
	if err != nil {
		return err
	}
	defer stopForwarder()

	// The outbox gauges: pending rows, oldest pending age, dead letters.
	// They read the outbox at most once a second, however often it is
	// scraped, and do not depend on a forwarder running.
	unregister, err := forwarder.RegisterOutboxMetrics(nil, db.wrapped, db.dialect, forwarder.OutboxMetricsOptions{MinInterval: time.Second})
	if err != nil {
		return err
	}
	defer unregister()

	// The forwarder reports its own status: running, partitions, last
	// publish and error, and the outbox's backlog.
	health := forwarder.HealthHandler(fw, forwarder.HealthOptions{MaxPendingAge: 30 * time.Second})
	mux := http.NewServeMux()
	mux.Handle("/metrics", tel.metricsHandler)
	mux.Handle("/healthz", health)
	mux.Handle("/readyz", health)
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	fmt.Printf("%s outbox -> forwarder -> Kafka (in process) -> router with the inbox middleware\n", db.name)
	fmt.Printf("metrics:   %s/metrics (Prometheus; dashboard.json and alerts.yml use them)\n", base)
	fmt.Printf("liveness:  %s/healthz\nreadiness: %s/readyz (not ready when the forwarder stops or a message waits over 30s)\n", base, base)
	fmt.Println("every tenth event is delivered twice, and the audit events fail on purpose until they are dead letters")

	place := func(i int) error { return placeOrder(ctx, db, orders, audit, i) }
	if !o.short {
		fmt.Printf("placing %d orders a second; interrupt to stop\n", o.rate)
		tick := time.NewTicker(time.Second / time.Duration(max(o.rate, 1)))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return nil
			case <-tick.C:
			}
			if err := place(i); err != nil {
				return err
			}
			if i > 0 && i%(10*max(o.rate, 1)) == 0 {
				tel.printTrace()
			}
		}
	}

	audits := 0
	for i := range o.n {
		if err := place(i); err != nil {
			return err
		}
		if isAudited(i) {
			audits++
		}
	}
	deadline := time.Now().Add(o.timeout)
	for {
		stats, err := db.dialect.OutboxStats(ctx, db.wrapped)
		if err != nil {
			return err
		}
		if handled.Load() >= int64(o.n) && duplicates.Load() >= int64(dest.duplicated.Load()) && stats.Dead == int64(audits) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("gave up: handled %d of %d orders, %d of %d duplicates skipped, %d of %d dead letters",
				handled.Load(), o.n, duplicates.Load(), dest.duplicated.Load(), stats.Dead, audits)
		}
		time.Sleep(20 * time.Millisecond)
	}
	tel.printTrace()

	ready := httpStatus(base+"/readyz") == http.StatusOK
	metricsOK, err := checkMetrics(base + "/metrics")
	if err != nil {
		fmt.Println(err)
	}
	stopForwarder()
	notReady := httpStatus(base+"/readyz") == http.StatusServiceUnavailable
	fmt.Printf("orders=%d handled=%d traces_continued=%d duplicates_skipped=%d dead_letters=%d ready=%t not_ready_after_stop=%t metrics=%s\n",
		o.n, handled.Load(), continued.Load(), duplicates.Load(), audits, ready, notReady, map[bool]string{true: "ok", false: "missing"}[metricsOK])
	if !ready || !notReady || !metricsOK || continued.Load() != int64(o.n) {
		return errors.New("the observability checks failed")
	}
	return nil
}

// isAudited reports whether order i also writes an audit event.
func isAudited(i int) bool { return i%20 == 0 }

// placeOrder writes the events of order i in one transaction, inside the
// span of the request that placed it: the outbox publisher stores the
// span's trace context in each event's metadata.
func placeOrder(ctx context.Context, db *database, orders, audit string, i int) error {
	ctx, span := otel.Tracer("shop").Start(ctx, "POST /orders")
	defer span.End()
	tx, err := db.wrapped.Begin(ctx, db.txOptions)
	if err != nil {
		return err
	}
	defer sqladapters.Rollback(tx)
	// A long-lived context publisher: it takes the transaction, and the
	// trace context, from each message's context.
	pub, err := forwarder.NewContextPublisher(forwarder.PublisherConfig{Dialect: db.dialect})
	if err != nil {
		return err
	}
	ev := OrderPlaced{OrderID: fmt.Sprintf("order-%05d", i), TraceID: span.SpanContext().TraceID().String()}
	payload, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	msgCtx := sqladapters.WithTx(ctx, tx)
	msg := message.NewMessage(watermill.NewUUID(), payload)
	msg.SetContext(msgCtx)
	if err := pub.Publish(orders, msg); err != nil {
		return err
	}
	if isAudited(i) {
		a := message.NewMessage(watermill.NewUUID(), payload)
		a.SetContext(msgCtx)
		if err := pub.Publish(audit, a); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// demoDestination is the forwarder's destination: Kafka, with faults.
type demoDestination struct {
	message.Publisher
	failTopic  string
	sent       atomic.Int64
	duplicated atomic.Int64
}

func (d *demoDestination) Publish(topic string, msgs ...*message.Message) error {
	if topic == d.failTopic {
		return errors.New("audit service unavailable")
	}
	if err := d.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if d.sent.Add(1)%10 == 0 {
			if err := d.Publisher.Publish(topic, m.Copy()); err == nil {
				d.duplicated.Add(1)
			}
		}
	}
	return nil
}

func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// wantMetrics are series the run must have produced.
var wantMetrics = []string{
	"millbox_outbox_pending",
	"millbox_outbox_oldest_pending_age_seconds",
	"millbox_outbox_dead_letters",
	"messaging_client_consumed_messages_total",
	"messaging_process_duration_seconds_bucket",
	"messaging_client_sent_messages_total",
	"messaging_client_operation_duration_seconds_bucket",
	"millbox_forwarder_partitions",
	"millbox_forwarder_running",
}

// checkMetrics scrapes url and reports whether every wanted series is there.
func checkMetrics(url string) (bool, error) {
	resp, err := http.Get(url)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	var missing []string
	for _, name := range wantMetrics {
		if !strings.Contains(string(body), "\n"+name+"{") {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return false, fmt.Errorf("missing from /metrics: %s", strings.Join(missing, ", "))
	}
	return true, nil
}
