package browser_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// The errors the destination answers with, per topic: errors about the
// message, which dead-letter it, not about the destination being down,
// which pauses the forwarder. The webhook's is attacker-controlled text, as
// a remote system's error often is.
var failures = map[string]string{
	"payments": "kafka server: Message was too large, server rejected it to avoid allocation error",
	"invoices": `schema registry: subject "invoices-value": incompatible schema: field "total" changed from int to string`,
	"webhooks": `upstream answered 502: <script>document.title="pwned"</script><img src=x onerror="document.title='pwned'">`,
}

// How many messages the test writes per topic; orders stay pending.
var published = map[string]int{"payments": 3, "invoices": 2, "webhooks": 1, "orders": 4}

const (
	payloadScript = `{"note":"<script>document.title='pwned'</script>"}`
	pageTitle     = "millbox · outbox admin"
	owner         = "billing-worker-7f9c"
)

func TestAdminPage(t *testing.T) {
	chromium := chromiumPath(t)
	pool := testenv.Postgres(t)
	db := pgxv5.WrapPool(pool)
	d := testenv.PostgresDialect(t, db, pool, postgres.Options{OutboxTable: testenv.UniqueName("admin_")})
	ctx := testenv.Ctx(t, 4*time.Minute)

	seed(t, ctx, db, d)

	// The allowed page warns of any pending message older than a
	// millisecond: the orders are.
	allowed := serve(t, d, db, func(*http.Request) bool { return true }, func(c *admin.Config) { c.Warnings.PendingAge = time.Millisecond })
	denied := serve(t, d, db, nil)
	browser := newBrowser(t, ctx, chromium)

	var groupRows []*chromedp.Node
	t.Run("overview shows what the database holds", func(t *testing.T) {
		want := dbCounts(t, ctx, pool, d)
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#topics")))
		for topic, c := range want {
			sel := fmt.Sprintf(`#topics tr[data-topic=%q]`, topic)
			if got := text(t, browser, sel+" td.pending"); got != fmt.Sprint(c.pending) {
				t.Errorf("%s pending shown %s, database %d", topic, got, c.pending)
			}
			if got := text(t, browser, sel+" td.dead"); got != fmt.Sprint(c.dead) {
				t.Errorf("%s dead shown %s, database %d", topic, got, c.dead)
			}
		}
		if got := text(t, browser, "#total td.pending"); got != "4" {
			t.Errorf("total pending shown %s, want 4", got)
		}
		if got := text(t, browser, "#total td.dead"); got != "6" {
			t.Errorf("total dead shown %s, want 6", got)
		}
		if got := text(t, browser, `#inbox tr[data-consumer="billing"] td.records`); got != "5" {
			t.Errorf("inbox records of billing shown %s, want 5", got)
		}
		if got := text(t, browser, fmt.Sprintf(`#owners tr[data-instance=%q] td.held`, owner)); got != "4" {
			t.Errorf("partitions held by %s shown %s, want 4", owner, got)
		}
		where := text(t, browser, "#where")
		for _, want := range []string{"postgres", d.Schema(), tableName(d.OutboxTable()), tableName(d.InboxTable())} {
			if !strings.Contains(where, want) {
				t.Errorf("the header %q does not name %s", where, want)
			}
		}
		groupRows = get(t, browser, chromedp.Nodes(chromedp.CSSAll("#groups tr.group")))
		if len(groupRows) != len(failures) {
			t.Fatalf("%d error groups shown, want %d", len(groupRows), len(failures))
		}
		for i, n := range groupRows {
			fp, _ := n.Attribute("data-group")
			topic := topicOf(t, fp)
			count := text(t, browser, fmt.Sprintf("#groups tbody tr:nth-child(%d) td.count", i+1))
			if count != fmt.Sprint(published[topic]) {
				t.Errorf("group of %s shows %s messages, want %d", topic, count, published[topic])
			}
		}
		saveScreenshot(t, browser)
	})

	t.Run("warnings", func(t *testing.T) {
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#warnings")))
		if got := text(t, browser, "#warn-pending"); !strings.Contains(got, "The oldest pending message has waited") {
			t.Errorf("the warning of old pending messages reads %q", got)
		}
		if got := text(t, browser, "#warn-dead"); !strings.HasPrefix(got, "6 dead letters wait") {
			t.Errorf("the warning of dead letters reads %q", got)
		}
		for _, sel := range []string{"#total td.oldest.warn", "#total td.dead.warn"} {
			if n := get(t, browser, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0))); len(n) != 1 {
				t.Errorf("%s: %d cells marked, want 1", sel, len(n))
			}
		}
		if n := get(t, browser, chromedp.Nodes(chromedp.CSSAll("#warn-no-forwarder"), chromedp.AtLeast(0))); len(n) != 0 {
			t.Error("the page warns that no forwarder holds a partition while one holds them all")
		}
		// The page without thresholds below the defaults does not call a
		// fresh pending message old.
		run(t, browser, chromedp.Navigate(denied+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#topics")))
		if n := get(t, browser, chromedp.Nodes(chromedp.CSSAll("#warn-pending"), chromedp.AtLeast(0))); len(n) != 0 {
			t.Error("the page with the default threshold warns of messages written a moment ago")
		}
		// Auto-refresh through the page's own link.
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.Click(chromedp.CSS(`#refresh a[href="./?refresh=10"]`)), chromedp.WaitReady(chromedp.CSS(`meta[http-equiv="refresh"]`)))
		if got := get(t, browser, chromedp.AttributeValue(chromedp.CSS(`meta[http-equiv="refresh"]`), "content")); got.Value != "10; url=./?refresh=10" {
			t.Errorf("auto-refresh meta %q", got.Value)
		}
	})

	t.Run("attacker-controlled text is shown, not run", func(t *testing.T) {
		title := get(t, browser, chromedp.Title())
		if title != pageTitle {
			t.Fatalf("title %q: a script ran", title)
		}
		// The group's link carries its fingerprint.
		row := rowOf(groupRows, "webhooks")
		run(t, browser,
			chromedp.Click(chromedp.CSS(fmt.Sprintf("#groups tbody tr:nth-child(%d) td.error a", row))),
			chromedp.WaitVisible(chromedp.CSS("#letters")))
		if got := text(t, browser, "#group-error"); got != failures["webhooks"] {
			t.Fatalf("group error shown as %q, want the text %q", got, failures["webhooks"])
		}
		run(t, browser, chromedp.Click(chromedp.CSS("#letters tbody tr:first-child a")), chromedp.WaitVisible(chromedp.CSS("#letter-payload")))
		if got := text(t, browser, "#letter-error"); got != failures["webhooks"] {
			t.Fatalf("error shown as %q, want the text %q", got, failures["webhooks"])
		}
		if got := text(t, browser, "#letter-payload"); !strings.Contains(got, "<script>document.title='pwned'</script>") {
			t.Fatalf("payload shown as %q, want the script as text", got)
		}
		title = get(t, browser, chromedp.Title())
		if title != pageTitle {
			t.Fatalf("title %q: a script ran", title)
		}
	})

	t.Run("cross-site POST is refused", func(t *testing.T) {
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#groups")))
		token := get(t, browser, chromedp.Value(chromedp.CSS(`#groups input[name="token"]`)))
		// Another site, knowing even the token, submits a requeue.
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprintf(w, `<!doctype html><title>win a prize</title>
<form method="post" action="%s/admin/requeue"><input type="hidden" name="token" value="%s">
<input type="hidden" name="group" value="%s"><button id="go" type="submit">claim</button></form>`,
				allowed, token, group("payments"))
		}))
		defer evil.Close()
		// 127.0.0.1 is another site than localhost, where the page is.
		run(t, browser, chromedp.Navigate(evil.URL), chromedp.Click(chromedp.CSS("#go")), chromedp.WaitVisible(chromedp.CSS(".problem h1")))
		if got := text(t, browser, ".problem h1"); got != "Cross-origin request refused" {
			t.Fatalf("cross-site requeue answered %q", got)
		}
		if c := dbCounts(t, ctx, pool, d)["payments"]; c.dead != 3 {
			t.Fatalf("payments dead = %d after a cross-site requeue, want 3", c.dead)
		}
	})

	t.Run("read-only without authorization", func(t *testing.T) {
		run(t, browser, chromedp.Navigate(denied+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#read-only")))
		buttons := get(t, browser, chromedp.Nodes(chromedp.CSSAll("button"), chromedp.AtLeast(0)))
		forms := get(t, browser, chromedp.Nodes(chromedp.CSSAll("form"), chromedp.AtLeast(0)))
		if len(buttons)+len(forms) != 0 {
			t.Fatalf("read-only page shows %d buttons and %d forms", len(buttons), len(forms))
		}
		// A same-origin POST with a well-formed token and cookie, as a
		// script on the page or a hand-made request could send.
		const tok = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
		req, _ := http.NewRequest(http.MethodPost, denied+"/admin/requeue",
			strings.NewReader(url.Values{"token": {tok}, "group": {group("payments")}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "same-origin")
		req.AddCookie(&http.Cookie{Name: "millbox_admin", Value: tok})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("forged requeue answered %d, want 403", resp.StatusCode)
		}
		if c := dbCounts(t, ctx, pool, d)["payments"]; c.dead != 3 {
			t.Fatalf("payments dead = %d after a refused requeue, want 3", c.dead)
		}
	})

	t.Run("requeue a group, then it is delivered", func(t *testing.T) {
		// The invoices were written an hour ago: requeued, they wait from
		// the requeue.
		if _, err := pool.Exec(ctx, `UPDATE `+d.OutboxTable()+` SET created_at = created_at - interval '1 hour' WHERE topic = 'invoices'`); err != nil {
			t.Fatal(err)
		}
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#groups")))
		row := rowOf(groupRows, "invoices")
		run(t, browser,
			chromedp.Click(fmt.Sprintf("#groups tbody tr:nth-child(%d) button.requeue", row)),
			chromedp.WaitVisible(chromedp.CSS("#notice")))
		if got := text(t, browser, "#notice"); got != "Requeued 2 dead letters." {
			t.Fatalf("notice %q after requeue", got)
		}
		c := dbCounts(t, ctx, pool, d)["invoices"]
		if c.dead != 0 || c.pending != 2 {
			t.Fatalf("invoices after requeue: pending=%d dead=%d, want 2 and 0", c.pending, c.dead)
		}
		if got := text(t, browser, `#topics tr[data-topic="invoices"] td.pending`); got != "2" {
			t.Fatalf("invoices pending shown %s after requeue, want 2", got)
		}
		if got := text(t, browser, `#topics tr[data-topic="invoices"] td.oldest`); !strings.HasSuffix(got, "s") || strings.ContainsAny(got, "hd") {
			t.Fatalf("invoices created an hour ago and requeued now: oldest pending shown %q, want seconds", got)
		}

		// The instance holding the partitions goes away; a forwarder
		// with a working destination takes over and delivers them.
		if err := d.ReleasePartitions(ctx, db, owner, []int{0, 1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		run(t, browser, chromedp.Navigate(allowed+"/admin/"), chromedp.WaitVisible(chromedp.CSS("#warn-no-forwarder")))
		if got := text(t, browser, "#warn-no-forwarder"); !strings.HasPrefix(got, "No forwarder holds a partition") {
			t.Fatalf("the warning that no forwarder runs reads %q", got)
		}
		dest := &recorder{}
		stop := startForwarder(t, ctx, db, d, dest)
		defer stop()
		waitFor(t, ctx, "the requeued invoices to be delivered", func() bool { return dest.count("invoices") == 2 })
	})

	t.Run("discard one message from its page", func(t *testing.T) {
		run(t, browser,
			chromedp.Navigate(allowed+"/admin/dead?group="+group("webhooks")),
			chromedp.Click(chromedp.CSS("#letters tbody tr:first-child a")),
			chromedp.WaitVisible(chromedp.CSS("form.discard")),
			chromedp.Click(chromedp.CSS(`form.discard input[name="confirm"]`)),
			chromedp.Click(chromedp.CSS("form.discard button")),
			chromedp.WaitVisible(chromedp.CSS("#notice")))
		if got := text(t, browser, "#notice"); got != "Discarded 1 dead letter." {
			t.Fatalf("notice %q after discard", got)
		}
		if c := dbCounts(t, ctx, pool, d)["webhooks"]; c.dead != 0 || c.pending != 0 {
			t.Fatalf("webhooks after discard: pending=%d dead=%d, want none", c.pending, c.dead)
		}
	})
}

// seed publishes the messages, makes all but the orders dead with a
// forwarder whose destination refuses them, and has an instance hold
// the partitions.
func seed(t *testing.T, ctx context.Context, db sqladapters.DB, d *postgres.Dialect) {
	t.Helper()
	for _, topic := range []string{"payments", "invoices", "webhooks"} {
		publish(t, ctx, db, d, topic, published[topic])
	}
	stop := startForwarder(t, ctx, db, d, refusing{})
	var last sqladapters.OutboxStats
	waitFor(t, ctx, "the refused messages to be dead-lettered", func() bool {
		b, err := d.OutboxStats(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		if b != last {
			t.Logf("outbox: %d pending, %d dead", b.Pending, b.Dead)
			last = b
		}
		return b.Dead == 6
	})
	stop()
	publish(t, ctx, db, d, "orders", published["orders"])
	if err := d.ClaimPartitions(ctx, db, owner, 10*time.Minute, 4); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := d.RecordInbox(ctx, db, "billing", fmt.Sprintf("m-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
}

func publish(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, topic string, n int) {
	t.Helper()
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sqladapters.Rollback(tx)
	pub, err := forwarder.NewPublisher(tx, forwarder.PublisherConfig{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m := message.NewMessage(fmt.Sprintf("%s-%d-%d", topic, i, time.Now().UnixNano()), []byte(payloadScript))
		m.Metadata.Set("tenant", `acme "<b>bold</b>"`)
		if err := pub.Publish(topic, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func startForwarder(t *testing.T, ctx context.Context, db sqladapters.DB, d sqladapters.Dialect, dest message.Publisher) (stop func()) {
	t.Helper()
	fw, err := forwarder.New(forwarder.Config{
		DB:                  db,
		Dialect:             d,
		Destination:         dest,
		MaxAttempts:         1,
		DelayedPollInterval: 50 * time.Millisecond,
		Logger:              watermill.NewSlogLogger(slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))),
		Source:              forwarder.Polling{PollInterval: 50 * time.Millisecond, Partitions: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx) }()
	select {
	case <-fw.Running():
	case err := <-done:
		t.Fatalf("forwarder: %v", err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := fw.Close(); err != nil {
				t.Errorf("close forwarder: %v", err)
			}
			if err := <-done; err != nil {
				t.Errorf("forwarder: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// refusing is a destination that refuses every message with its topic's
// error.
type refusing struct{}

func (refusing) Publish(topic string, _ ...*message.Message) error {
	return errors.New(failures[topic])
}
func (refusing) Close() error { return nil }

// recorder is a destination that accepts everything and counts per topic.
type recorder struct {
	mu   sync.Mutex
	seen map[string]map[string]bool
}

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seen == nil {
		r.seen = map[string]map[string]bool{}
	}
	if r.seen[topic] == nil {
		r.seen[topic] = map[string]bool{}
	}
	for _, m := range msgs {
		r.seen[topic][m.UUID] = true
	}
	return nil
}
func (r *recorder) Close() error { return nil }

func (r *recorder) count(topic string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen[topic])
}

type counts struct{ pending, dead int64 }

// dbCounts reads the outbox with its own SQL, independently of the page.
func dbCounts(t *testing.T, ctx context.Context, pool *pgxpool.Pool, d sqladapters.Dialect) map[string]counts {
	t.Helper()
	rows, err := pool.Query(ctx, `SELECT topic, sum(pending), sum(dead) FROM (
		SELECT topic, 1 AS pending, 0 AS dead FROM `+d.OutboxTable()+`
		UNION ALL SELECT topic, 0, 1 FROM `+d.(interface{ Tables() []string }).Tables()[5]+`) t GROUP BY topic`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]counts{}
	for rows.Next() {
		var topic string
		var c counts
		if err := rows.Scan(&topic, &c.pending, &c.dead); err != nil {
			t.Fatal(err)
		}
		out[topic] = c
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// group returns the fingerprint of the error group of topic's failures.
func group(topic string) string { return sqladapters.FingerprintError(failures[topic]).String() }

// topicOf returns the topic whose failures form the group of fingerprint
// fp.
func topicOf(t *testing.T, fp string) string {
	t.Helper()
	for topic := range failures {
		if group(topic) == fp {
			return topic
		}
	}
	t.Fatalf("unexpected error group %q", fp)
	return ""
}

// rowOf returns the position, from 1, of topic's group among rows.
func rowOf(rows []*chromedp.Node, topic string) int {
	for i, n := range rows {
		if fp, _ := n.Attribute("data-group"); fp == group(topic) {
			return i + 1
		}
	}
	return 0
}

// tableName is the last part of a quoted, qualified name.
func tableName(quoted string) string {
	return strings.Trim(quoted[strings.LastIndex(quoted, ".")+1:], `"`)
}

// serve mounts the admin page under /admin on a test server and returns
// its address, named localhost so that 127.0.0.1 is another site.
func serve(t *testing.T, d sqladapters.Dialect, db sqladapters.DB, authorize func(*http.Request) bool, configure ...func(*admin.Config)) string {
	t.Helper()
	cfg := admin.Config{DB: db, Dialect: d, Authorize: authorize}
	for _, c := range configure {
		c(&cfg)
	}
	h, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
}

// chromiumPath finds the browser: $MILLBOX_CHROMIUM, or chromium on the
// PATH.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("MILLBOX_CHROMIUM"); p != "" {
		return p
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		testenv.Unavailable(t, "Chromium (apt-get install chromium)", err)
	}
	return p
}

func newBrowser(t *testing.T, ctx context.Context, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // running as root in containers
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	browser, cancel := chromedp.NewContext(alloc, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancel)
	if err := chromedp.Do(browser); err != nil {
		testenv.Unavailable(t, "Chromium at "+path, err)
	}
	return browser
}

// run runs the steps in the browser's tab, stopping the test at the
// first failure.
func run(t *testing.T, browser context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(browser, steps...); err != nil {
		t.Fatal(err)
	}
}

// get runs an action that returns a value.
func get[T any](t *testing.T, browser context.Context, a chromedp.Action[T]) T {
	t.Helper()
	v, err := chromedp.Run(browser, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// text returns an element's text as the DOM holds it (textContent).
func text(t *testing.T, browser context.Context, sel string) string {
	t.Helper()
	return strings.TrimSpace(get(t, browser, chromedp.TextContent(chromedp.CSS(sel))))
}

// saveScreenshot stores the page as a test artifact, and as the admin
// package's illustration when MILLBOX_SCREENSHOT=1.
func saveScreenshot(t *testing.T, browser context.Context) {
	t.Helper()
	png := get(t, browser, chromedp.FullScreenshot(100))
	paths := []string{filepath.Join(t.ArtifactDir(), "admin.png")}
	if os.Getenv("MILLBOX_SCREENSHOT") == "1" {
		paths = append(paths, filepath.Join("..", "..", "sqladapters", "admin", "testdata", "admin.png"))
	}
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", p)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}
