// Admin serves millbox's admin page (sqladapters/admin) next to an
// application that publishes through the outbox, and shows an operator's
// way through a dead letter: find it, read its error and payload, requeue
// it once the cause is fixed.
//
// It publishes a few payment events; the destination is down for the
// first attempts at one of them, so that event is dead-lettered after its
// retries. Then the destination recovers, and the page's Requeue button
// sends the event again.
//
//	go run ./examples/admin                 # SQLite in a temporary directory
//	go run ./examples/admin -db postgres    # PostgreSQL at $MILLBOX_POSTGRES_URL
//	go run ./examples/admin -read-only      # the page without its buttons
//
// The page sits behind the application's login, as it must: it shows
// payloads and errors, which may hold personal data. This example's login
// is a stand-in (GET /login?as=operator or ?as=viewer sets a session
// cookie); a real application uses its own. View lets any logged-in user
// see the page, Authorize lets operators change it, and the form tokens
// are bound to the login session. In production serve it over HTTPS (set
// admin.Config.BehindTLSProxy when a proxy terminates TLS).
//
// It prints the page's address and serves until interrupted. With -short it
// logs in as an operator and requeues the dead letter through the page's
// own form instead, waits for its delivery and exits; the last line is a
// summary a script can check:
//
//	published=5 dead_lettered=1 requeued=1 delivered=5 ok=true
package main

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/examples/internal/exampleenv"
	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

const (
	topic    = "payments.captured"
	messages = 5
	// poisoned is the message the destination refuses while it is down.
	poisoned = 2
)

type options struct {
	short    bool
	readOnly bool
	addr     string
	database string
	timeout  time.Duration
}

func main() {
	var o options
	def := "sqlite"
	if os.Getenv("MILLBOX_POSTGRES_URL") != "" {
		def = "postgres"
	}
	flag.BoolVar(&o.short, "short", false, "requeue the dead letter through the page, check its delivery, print a summary and exit")
	flag.BoolVar(&o.readOnly, "read-only", false, "serve the page without the permission to change anything")
	flag.StringVar(&o.addr, "addr", "127.0.0.1:8080", "`address` to serve the page on (port 0 with -short)")
	flag.StringVar(&o.database, "db", def, "sqlite, or postgres at $MILLBOX_POSTGRES_URL (the default when it is set)")
	flag.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up waiting for the forwarder after this long")
	flag.Parse()
	switch {
	case o.database != "sqlite" && o.database != "postgres":
		fmt.Fprintln(os.Stderr, "admin: -db must be sqlite or postgres")
		os.Exit(2)
	case o.short && o.readOnly:
		fmt.Fprintln(os.Stderr, "admin: -short requeues through the page; it cannot be -read-only")
		os.Exit(2)
	}
	if o.short && o.addr == "127.0.0.1:8080" {
		o.addr = "127.0.0.1:0"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "admin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	logger := watermill.NewSlogLogger(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	db, err := openDatabase(ctx, o.database)
	if err != nil {
		return err
	}
	defer db.cleanup()
	fmt.Println("millbox tables ready in", db.where)

	// The admin page, mounted under /admin/ of the application's server,
	// behind its login: View asks for a logged-in user, Authorize for an
	// operator, and the forms only work in the session they were shown
	// in.
	logins := &sessions{users: map[string]string{}}
	page, err := admin.New(admin.Config{
		DB:            db.db,
		Dialect:       db.dialect,
		Title:         "millbox example",
		View:          func(r *http.Request) bool { return logins.user(r) != "" },
		Authorize:     func(r *http.Request) bool { return logins.user(r) == "operator" && !o.readOnly },
		SessionCookie: sessionCookie,
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", page))
	mux.HandleFunc("GET /login", logins.login)
	mux.Handle("/{$}", http.RedirectHandler("/admin/", http.StatusFound))
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	pageURL := "http://" + ln.Addr().String() + "/admin/"
	fmt.Println("admin page:", pageURL, "(log in first:", strings.TrimSuffix(pageURL, "admin/")+"login?as=operator)")

	// The destination is down for the poisoned message until it recovers.
	dest := &destination{}
	stopForwarder, err := exampleenv.StartForwarder(ctx, mustForwarder(db, dest, logger))
	if err != nil {
		return err
	}
	defer func() { stopForwarder() }()
	fmt.Println("forwarder running")

	fmt.Printf("publishing %d events to %s; the destination refuses event %d until it recovers\n", messages, topic, poisoned)
	if err := publish(ctx, db); err != nil {
		return err
	}
	if err := waitFor(ctx, o.timeout, "the refused event to be dead-lettered", func() bool {
		b, err := db.dialect.OutboxStats(ctx, db.db)
		return err == nil && b.Pending == 0 && b.Dead == 1
	}); err != nil {
		return err
	}
	deadLettered := 1
	dest.recover()
	fmt.Printf("event %d is a dead letter after %d refused attempts; the destination has recovered\n", poisoned, dest.refusals())

	var requeued int64
	if o.short {
		if requeued, err = requeueThroughPage(ctx, pageURL); err != nil {
			return err
		}
		fmt.Printf("requeued %d dead letter through the page\n", requeued)
	} else {
		fmt.Printf("open %s, find the dead letter by its error and press Requeue; Ctrl-C stops\n", pageURL)
		go func() {
			if waitFor(ctx, 24*time.Hour, "the requeued event", func() bool { return dest.delivered() == messages }) == nil {
				fmt.Printf("event %d requeued and delivered; Ctrl-C stops\n", poisoned)
			}
		}()
		<-ctx.Done()
		if dest.delivered() == messages {
			requeued = 1
		}
	}
	if err := waitFor(context.WithoutCancel(ctx), o.timeout, "the requeued event to be delivered", func() bool {
		return requeued == 0 || dest.delivered() == messages
	}); err != nil {
		return err
	}
	stopForwarder()
	ok := dest.delivered() == messages && requeued == 1
	fmt.Printf("published=%d dead_lettered=%d requeued=%d delivered=%d ok=%t\n",
		messages, deadLettered, requeued, dest.delivered(), ok)
	if o.short && !ok {
		return errors.New("the requeued event was not delivered")
	}
	return nil
}

// requeueThroughPage does what an operator does in a browser: it logs in,
// opens the page, which sets the form token cookie, and submits the
// Requeue form of the first error group.
func requeueThroughPage(ctx context.Context, pageURL string) (int64, error) {
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	login, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(pageURL, "admin/")+"login?as=operator", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(login)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		return 0, fmt.Errorf("login answered %s", resp.Status)
	}
	body, err := get(ctx, client, pageURL)
	if err != nil {
		return 0, err
	}
	form := regexp.MustCompile(`<form method="post" action="\./requeue"><input type="hidden" name="token" value="([^"]+)"><input type="hidden" name="group" value="([0-9a-f]{32})">`).
		FindStringSubmatch(body)
	if form == nil {
		return 0, errors.New("the page shows no Requeue button")
	}
	values := url.Values{"token": {html.UnescapeString(form[1])}, "group": {form[2]}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, pageURL+"requeue", strings.NewReader(values.Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = client.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(loc, "./?requeued=") {
		return 0, fmt.Errorf("requeue answered %s, Location %q", resp.Status, loc)
	}
	var n int64
	_, err = fmt.Sscanf(strings.TrimPrefix(loc, "./?requeued="), "%d", &n)
	return n, err
}

func get(ctx context.Context, client *http.Client, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return string(b), err
}

// publish writes the events, each in a transaction of its own as an
// application's requests would.
func publish(ctx context.Context, db *database) error {
	for i := range messages {
		tx, err := db.db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			return err
		}
		pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: db.dialect})
		if err == nil {
			payload := fmt.Sprintf(`{"payment_id":"pay-%03d","amount_cents":%d,"currency":"EUR"}`, i, 1000+i*250)
			msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
			msg.Metadata.Set("partition_key", fmt.Sprintf("customer-%d", i))
			msg.Metadata.Set("poisoned", fmt.Sprint(i == poisoned))
			err = pub.Publish(topic, msg)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			sqladapters.Rollback(tx)
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}

func mustForwarder(db *database, dest message.Publisher, logger watermill.LoggerAdapter) *forwarder.Forwarder {
	fw, err := forwarder.New(forwarder.Config{
		DB:          db.db,
		Dialect:     db.dialect,
		Destination: dest,
		// Give up quickly, so the example reaches its dead letter soon.
		MaxAttempts:         3,
		Retry:               forwarder.ExponentialRetry{Min: 20 * time.Millisecond, Max: 100 * time.Millisecond},
		DelayedPollInterval: 100 * time.Millisecond,
		Source:              forwarder.Polling{PollInterval: 100 * time.Millisecond},
		Logger:              logger,
	})
	if err != nil {
		panic(err) // the config above is valid
	}
	return fw
}

// destination stands for the broker: it refuses the poisoned message
// until recover is called, and records every message it accepts.
type destination struct {
	recovered atomic.Bool
	refused   atomic.Int64
	mu        sync.Mutex
	seen      map[string]bool
}

func (d *destination) Publish(_ string, msgs ...*message.Message) error {
	for _, m := range msgs {
		if m.Metadata.Get("poisoned") == "true" && !d.recovered.Load() {
			fmt.Printf("the destination refused event %d (attempt %d)\n", poisoned, d.refused.Add(1))
			return errors.New(`payments-gateway: POST /v1/captures: 503 Service Unavailable: upstream "acquirer" timed out after 30s`)
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	for _, m := range msgs {
		d.seen[m.UUID] = true
	}
	return nil
}

func (d *destination) Close() error { return nil }

func (d *destination) recover() { d.recovered.Store(true) }

func (d *destination) refusals() int64 { return d.refused.Load() }

func (d *destination) delivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seen)
}

func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting for %s: %w", what, ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// database is the installation: the millbox tables in a SQLite file or in
// a PostgreSQL schema of their own, removed at the end.
type database struct {
	db      sqladapters.DB
	dialect sqladapters.Dialect
	where   string // the file or schema, for the reader
	cleanup func()
}

func openDatabase(ctx context.Context, kind string) (*database, error) {
	var d *database
	switch kind {
	case "postgres":
		pool, err := pgxpool.New(ctx, exampleenv.PostgresURL())
		if err != nil {
			return nil, err
		}
		schema := fmt.Sprintf("millbox_admin_%08x", rand.Uint32())
		dialect, err := postgres.New(postgres.Options{Schema: schema})
		if err != nil {
			pool.Close()
			return nil, err
		}
		d = &database{db: pgxv5.WrapPool(pool), dialect: dialect, where: "PostgreSQL schema " + schema, cleanup: func() {
			_, _ = pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+schema+`" CASCADE`)
			pool.Close()
		}}
	default:
		dir, err := os.MkdirTemp("", "millbox-admin-")
		if err != nil {
			return nil, err
		}
		sqlDB, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		d = &database{db: stdsql.WrapDB(sqlDB), dialect: sqlite.MustNew(sqlite.Options{}), where: "SQLite file " + filepath.Join(dir, "app.db"), cleanup: func() {
			sqlDB.Close()
			os.RemoveAll(dir)
		}}
	}
	if err := sqladapters.Migrate(ctx, d.db, d.dialect); err != nil {
		d.cleanup()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return d, nil
}

// sessionCookie is the example application's login cookie.
const sessionCookie = "example_session"

// sessions is a stand-in for the application's login: GET /login?as=NAME
// starts a session as NAME (operator or viewer), with no password. A real
// application has its own login; the admin page only asks it, through
// View and Authorize, who the request comes from.
type sessions struct {
	mu    sync.Mutex
	users map[string]string // session id to user
}

func (s *sessions) login(w http.ResponseWriter, r *http.Request) {
	as := r.URL.Query().Get("as")
	if as != "operator" && as != "viewer" {
		http.Error(w, "log in with ?as=operator or ?as=viewer", http.StatusBadRequest)
		return
	}
	id := crand.Text() // session ids must be unguessable
	s.mu.Lock()
	s.users[id] = as
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteLaxMode})
	w.Header().Set("Location", "/admin/")
	w.WriteHeader(http.StatusSeeOther)
}

// user returns the user of the request's session, "" without one.
func (s *sessions) user(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.users[c.Value]
}
