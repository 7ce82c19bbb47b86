package admin_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/mysqltest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/pgtest"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

const scriptError = `upstream said <script>document.title="pwned"</script> & gave up`

// fixture is an installation with dead letters, served by the admin
// handler under /admin.
type fixture struct {
	db      sqladapters.DB
	dialect sqladapters.Dialect
	srv     *httptest.Server
	// client keeps cookies, as a browser would.
	client *http.Client
	// logs holds what the handler logged.
	logs *logBuffer
}

// backend opens a migrated, empty installation on one database.
type backend struct {
	name string
	open func(t *testing.T) (sqladapters.DB, sqladapters.Dialect)
}

var (
	// postgresBackend is a schema of its own on the server of
	// MILLBOX_POSTGRES_URL.
	postgresBackend = backend{"postgres", func(t *testing.T) (sqladapters.DB, sqladapters.Dialect) {
		pool := pgtest.Pool(t)
		db := pgxv5.WrapPool(pool)
		return db, pgtest.Dialect(t, db, pool, postgres.Options{})
	}}
	// backends are the databases the page's changes run on; MySQL comes
	// from MILLBOX_MYSQL_DSN. The SQLite module's tests run the page on
	// SQLite.
	backends = []backend{
		postgresBackend,
		{"mysql", func(t *testing.T) (sqladapters.DB, sqladapters.Dialect) {
			raw := mysqltest.DB(t)
			return stdsql.WrapDB(raw), mysqltest.Dialect(t, raw, mysql.Options{})
		}},
	}
)

func newFixture(t *testing.T, authorize func(*http.Request) bool, configure ...func(*admin.Config)) *fixture {
	return newFixtureOn(t, postgresBackend, authorize, configure...)
}

func newFixtureOn(t *testing.T, b backend, authorize func(*http.Request) bool, configure ...func(*admin.Config)) *fixture {
	t.Helper()
	f := &fixture{logs: &logBuffer{t: t}}
	f.db, f.dialect = b.open(t)
	f.serve(t, admin.Config{DB: f.db, Dialect: f.dialect, Authorize: authorize}, configure...)
	return f
}

// serve mounts a handler of cfg under /admin on a new test server.
func (f *fixture) serve(t *testing.T, cfg admin.Config, configure ...func(*admin.Config)) {
	t.Helper()
	cfg.Logger = slog.New(slog.NewTextHandler(f.logs, nil))
	for _, c := range configure {
		c(&cfg)
	}
	h, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	jar, _ := cookiejar.New(nil)
	f.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
}

// logBuffer collects log lines and passes them to the test's output.
type logBuffer struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	_, _ = l.t.Output().Write(p)
	return len(p), nil
}

// count returns the lines logged that contain s.
func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// seed writes n outbox rows of topic and makes them dead with errText.
func (f *fixture) seed(t *testing.T, topic, errText string, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	msgs := make([]sqladapters.OutboxMessage, n)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: topic, UUID: fmt.Sprintf("%.20s-%d", topic, i),
			Payload: []byte(`{"note":"<script>alert(1)</script>"}`), Metadata: []byte(`{}`)}
	}
	if err := f.dialect.InsertOutbox(ctx, f.db, msgs); err != nil {
		t.Fatal(err)
	}
	rows, err := f.dialect.ReadPending(ctx, f.db, sqladapters.PendingQuery{Limit: 1000}, false)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for _, r := range rows {
		if r.Topic != topic {
			continue
		}
		if _, err := f.dialect.RecordFailure(ctx, f.db, sqladapters.Failure{ID: r.ID, Attempts: 1, Error: errText, Dead: true}); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

func (f *fixture) count(t *testing.T) (pending, dead int64) {
	t.Helper()
	st, err := f.dialect.OutboxStats(context.Background(), f.db)
	if err != nil {
		t.Fatal(err)
	}
	return st.Pending, st.Dead
}

func (f *fixture) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, body := f.do(t, http.MethodGet, path, nil, nil)
	return resp.StatusCode, body
}

// post sends a form as a same-origin browser would, adding headers.
func (f *fixture) post(t *testing.T, path string, form url.Values, headers map[string]string) (*http.Response, string) {
	t.Helper()
	h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	for k, v := range headers {
		h[k] = v
	}
	return f.do(t, http.MethodPost, path, strings.NewReader(form.Encode()), h)
}

func (f *fixture) do(t *testing.T, method, path string, body io.Reader, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, f.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// token returns the form token of the page at path.
func (f *fixture) token(t *testing.T, path string) string {
	t.Helper()
	_, body := f.get(t, path)
	m := tokenRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("%s has no form token:\n%s", path, body)
	}
	return m[1]
}

var (
	tokenRE = regexp.MustCompile(`name="token" value="([^"]+)"`)
	groupRE = regexp.MustCompile(`data-group="([0-9a-f]{32})"`)
)

var sameOrigin = map[string]string{"Sec-Fetch-Site": "same-origin"}

func TestConfigRejected(t *testing.T) {
	d := sqlite.MustNew(sqlite.Options{})
	db := stdsql.WrapDB(nil)
	for _, tc := range []struct {
		name string
		cfg  admin.Config
		want string
	}{
		{"no DB", admin.Config{Dialect: d}, "Config.DB"},
		{"no dialect", admin.Config{DB: db}, "Config.Dialect"},
		{"page size", admin.Config{DB: db, Dialect: d, PageSize: 5000}, "Config.PageSize"},
		{"origin", admin.Config{DB: db, Dialect: d, TrustedOrigins: []string{"not an origin"}}, "Config.TrustedOrigins"},
		{"negative timeout", admin.Config{DB: db, Dialect: d, Timeout: -time.Second}, "Config.Timeout"},
		{"short form key", admin.Config{DB: db, Dialect: d, FormKey: []byte("short")}, "Config.FormKey"},
		{"session cookie", admin.Config{DB: db, Dialect: d, SessionCookie: "a b"}, "Config.SessionCookie"},
		{"concurrency", admin.Config{DB: db, Dialect: d, MaxConcurrent: -1}, "Config.MaxConcurrent"},
		{"refresh", admin.Config{DB: db, Dialect: d, Refresh: time.Second}, "Config.Refresh"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := admin.New(tc.cfg)
			if !errors.Is(err, sqladapters.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: got %v, want ErrInvalidConfig naming %s", err, tc.want)
			}
		})
	}
}

func TestReadOnlyRefusesChanges(t *testing.T) {
	f := newFixture(t, nil)
	f.seed(t, "orders", "broker down", 2)

	status, body := f.get(t, "/admin/")
	if status != http.StatusOK {
		t.Fatalf("GET /admin/: %d\n%s", status, body)
	}
	if strings.Contains(body, "<form") || strings.Contains(body, "<button") {
		t.Fatalf("read-only page has forms:\n%s", body)
	}
	if !strings.Contains(body, `id="read-only"`) {
		t.Fatal("read-only page does not say so")
	}
	// A forged POST, same-origin, with a well-formed token and cookie.
	tok := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	u, _ := url.Parse(f.srv.URL)
	f.client.Jar.SetCookies(u, []*http.Cookie{{Name: "millbox_admin", Value: tok, Path: "/"}})
	group := sqladapters.FingerprintError("broker down").String()
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {tok}, "group": {group}}, sameOrigin)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("forged requeue: %d, want 403", resp.StatusCode)
	}
	if _, dead := f.count(t); dead != 2 {
		t.Fatalf("dead = %d after a refused requeue, want 2", dead)
	}
}

func TestAuthorizedChanges(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { testAuthorizedChanges(t, b) })
	}
}

func testAuthorizedChanges(t *testing.T, b backend) {
	var deny atomic.Bool
	f := newFixtureOn(t, b, func(*http.Request) bool { return !deny.Load() })
	f.seed(t, "orders", "broker down", 3)
	f.seed(t, "invoices", scriptError, 1)
	brokerDown := sqladapters.FingerprintError("broker down").String()
	scripted := sqladapters.FingerprintError(scriptError).String()

	status, body := f.get(t, "/admin/")
	if status != http.StatusOK {
		t.Fatalf("GET /admin/: %d\n%s", status, body)
	}
	token := f.token(t, "/admin/")

	t.Run("escapes attacker-controlled text", func(t *testing.T) {
		if strings.Contains(body, "<script>") {
			t.Fatalf("page contains an unescaped <script>:\n%s", body)
		}
		if !strings.Contains(body, "&lt;script&gt;document.title=") {
			t.Fatal("the error text is missing from the page")
		}
	})
	t.Run("groups addressed by fingerprint", func(t *testing.T) {
		got := groupRE.FindAllStringSubmatch(body, -1)
		if len(got) != 2 || got[0][1] != brokerDown || got[1][1] != scripted {
			t.Fatalf("groups on the page: %v, want the fingerprints of both errors", got)
		}
		if strings.Contains(body, `name="error"`) {
			t.Fatal("a form carries an error text")
		}
	})

	t.Run("no token", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"group": {brokerDown}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue without token: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		wrong := "A" + token[1:]
		if token[0] == 'A' {
			wrong = "B" + token[1:]
		}
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {wrong}, "group": {brokerDown}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue with a wrong token: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("cross-site", func(t *testing.T) {
		resp, body := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {brokerDown}},
			map[string]string{"Sec-Fetch-Site": "cross-site"})
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "Cross-origin") {
			t.Fatalf("cross-site requeue: %d, want 403\n%s", resp.StatusCode, body)
		}
	})
	t.Run("foreign origin", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {brokerDown}},
			map[string]string{"Origin": "https://evil.example"})
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue from another origin: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("authorization withdrawn", func(t *testing.T) {
		deny.Store(true)
		defer deny.Store(false)
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {brokerDown}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue without authorization: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("names nothing", func(t *testing.T) {
		// A change acts on one dead letter or one error group, never on
		// every dead letter.
		for _, c := range []struct {
			path string
			form url.Values
		}{
			{"/admin/requeue", url.Values{"token": {token}}},
			{"/admin/discard", url.Values{"token": {token}, "confirm": {"yes"}}},
		} {
			resp, body := f.post(t, c.path, c.form, sameOrigin)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "names no message") {
				t.Fatalf("POST %s naming no dead letter: %d, want 400\n%s", c.path, resp.StatusCode, problemOf(body))
			}
		}
	})
	if pending, dead := f.count(t); pending != 0 || dead != 4 {
		t.Fatalf("after refused changes: pending=%d dead=%d, want 0 and 4", pending, dead)
	}

	t.Run("requeue group", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {brokerDown}}, sameOrigin)
		if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "./?requeued=3" {
			t.Fatalf("requeue: %d Location %q, want 303 to ./?requeued=3", resp.StatusCode, resp.Header.Get("Location"))
		}
		if pending, dead := f.count(t); pending != 3 || dead != 1 {
			t.Fatalf("after requeue: pending=%d dead=%d, want 3 and 1", pending, dead)
		}
		_, body := f.get(t, "/admin/?requeued=3")
		if !strings.Contains(body, "Requeued 3 dead letters.") {
			t.Fatalf("no notice after the redirect:\n%s", body)
		}
	})
	t.Run("discard needs confirmation", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/discard", url.Values{"token": {token}, "group": {scripted}}, sameOrigin)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("unconfirmed discard: %d, want 400", resp.StatusCode)
		}
		resp, _ = f.post(t, "/admin/discard", url.Values{"token": {token}, "group": {scripted}, "confirm": {"yes"}}, sameOrigin)
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("discard: %d, want 303", resp.StatusCode)
		}
		if _, dead := f.count(t); dead != 0 {
			t.Fatalf("after discard: dead=%d, want 0", dead)
		}
	})
}

// TestParametersValidated sends what an attacker sends to a page anyone
// who may view it can reach: every value that is not what its parameter
// takes is refused with 400 naming the parameter, before it reaches the
// database, and the answer shows nothing of a driver.
func TestParametersValidated(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { testParametersValidated(t, b) })
	}
}

func testParametersValidated(t *testing.T, b backend) {
	f := newFixtureOn(t, b, func(*http.Request) bool { return true })
	f.seed(t, "orders", "broker down", 1)
	for _, c := range []struct{ query, param string }{
		{"error=%00", "error"},
		{"error=%ff", "error"},
		{"error=%c0%af", "error"},
		{"error=a%00b", "error"},
		{"topic=%fe%ff", "topic"},
		{"key=" + strings.Repeat("k", 1025), "key"},
		{"error=", "error"},
		{"group=timeout", "group"},
		{"group=" + strings.Repeat("g", 32), "group"},
		{"group=%00", "group"},
		{"after=-1", "after"},
		{"after=1e3", "after"},
		{"after=99999999999999999999", "after"},
		{"after=%2B7", "after"},
		{"after=1&after=2", "after"},
		{"nope=1", "nope"},
		{"%00=1", `\x00`},
	} {
		status, body := f.get(t, "/admin/dead?"+c.query)
		if status != http.StatusBadRequest || !strings.Contains(body, "parameter &#34;"+c.param+"&#34;") {
			t.Errorf("GET /admin/dead?%.40s: %d, want 400 naming %q\n%.600s", c.query, status, c.param, problemOf(body))
		}
		if strings.Contains(body, "SQLSTATE") || strings.Contains(body, "byte sequence") || strings.Contains(body, "Error 1") {
			t.Errorf("GET /admin/dead?%.40s shows a driver error:\n%s", c.query, problemOf(body))
		}
	}
	for _, c := range []struct{ path, param string }{
		{"/admin/?refresh=1", "refresh"},
		{"/admin/?requeued=%ff", "requeued"},
		{"/admin/dead/1?full=yes", "full"},
		{"/admin/?" + strings.Repeat("x", 5000), "query"},
	} {
		status, body := f.get(t, c.path)
		if status != http.StatusBadRequest || !strings.Contains(body, c.param) {
			t.Errorf("GET %.60s: %d, want 400 naming %s\n%s", c.path, status, c.param, problemOf(body))
		}
	}
	// Valid filters pass, and odd text is only text.
	for _, q := range []string{"error=broker", "error=%27%3B+DROP+TABLE+x%3B--", "topic=orders&key=%E2%80%AE", "error=%25&after=0"} {
		if status, body := f.get(t, "/admin/dead?"+q); status != http.StatusOK {
			t.Errorf("GET /admin/dead?%s: %d\n%s", q, status, problemOf(body))
		}
	}

	token := f.token(t, "/admin/")
	group := sqladapters.FingerprintError("broker down").String()
	for _, c := range []struct {
		form  url.Values
		param string
	}{
		{url.Values{"token": {token}, "error": {"\x00"}}, "error"},
		{url.Values{"token": {token}, "group": {"\xff"}}, "group"},
		{url.Values{"token": {token}, "id": {"-3"}}, "id"},
		{url.Values{"token": {token}, "id": {"0"}}, "id"},
		{url.Values{"token": {token}, "group": {group, group}}, "group"},
		{url.Values{"token": {token}, "group": {group}, "confirm": {"sure"}}, "confirm"},
		{url.Values{"token": {"x"}, "group": {group}}, "token"},
	} {
		resp, body := f.post(t, "/admin/requeue", c.form, sameOrigin)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, "parameter &#34;"+c.param+"&#34;") {
			t.Errorf("POST /admin/requeue %.60q: %d, want 400 naming %q\n%s", c.form.Encode(), resp.StatusCode, c.param, problemOf(body))
		}
	}
	if _, dead := f.count(t); dead != 1 {
		t.Fatalf("dead = %d after refused changes, want 1", dead)
	}
}

// problemOf returns the problem page's heading and detail, for messages.
func problemOf(body string) string {
	if m := regexp.MustCompile(`(?s)<section class="problem">(.*?)</section>`).FindStringSubmatch(body); m != nil {
		return m[1]
	}
	return body
}

// TestServerErrorsAreGeneric reads a page whose tables are missing, many
// times: every answer shows a generic text with one reference id, no
// driver error, and the detail is logged once.
func TestServerErrorsAreGeneric(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	f := &fixture{logs: &logBuffer{t: t}, db: db, dialect: pgtest.Fresh(t, pool, postgres.Options{})}
	f.serve(t, admin.Config{DB: db, Dialect: f.dialect})
	var refs []string
	for range 5 {
		status, body := f.get(t, "/admin/")
		m := regexp.MustCompile(`Reference ([0-9a-f]{12})`).FindStringSubmatch(body)
		if status != http.StatusInternalServerError || m == nil || !strings.Contains(body, "millbox migrate up") {
			t.Fatalf("GET /admin/ with the tables missing: %d\n%s", status, problemOf(body))
		}
		if strings.Contains(body, "SQLSTATE") || strings.Contains(body, "does not exist") {
			t.Fatalf("the page shows the driver's error:\n%s", problemOf(body))
		}
		refs = append(refs, m[1])
	}
	for _, r := range refs {
		if r != refs[0] {
			t.Fatalf("one cause, several references: %v", refs)
		}
	}
	if n := f.logs.count("ref=" + refs[0]); n != 1 {
		t.Fatalf("the cause was logged %d times for 5 requests, want once", n)
	}
	if f.logs.count("SQLSTATE 42P01") != 1 {
		t.Fatal("the log lacks the driver's error")
	}
}

// gate is the database of a test that holds a request in flight: its
// queries wait until the gate opens.
type gate struct {
	sqladapters.Executor
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func (g *gate) Query(ctx context.Context, q string, args ...any) (sqladapters.Rows, error) {
	g.once.Do(func() { close(g.entered) })
	<-g.open
	return g.Executor.Query(ctx, q, args...)
}

// TestConcurrencyLimit holds one request in the database with a limit of
// one: the next is answered 503 with Retry-After at once instead of
// queueing another scan, and once the first is done, requests pass again.
func TestConcurrencyLimit(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	g := &gate{Executor: db, entered: make(chan struct{}), open: make(chan struct{})}
	f := &fixture{logs: &logBuffer{t: t}, db: db, dialect: d}
	f.serve(t, admin.Config{DB: g, Dialect: d, MaxConcurrent: 1})

	first := make(chan int, 1)
	go func() {
		resp, err := http.Get(f.srv.URL + "/admin/dead?error=x")
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	<-g.entered
	resp, body := f.do(t, http.MethodGet, "/admin/", nil, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a request over the limit: %d Retry-After %q, want 503 with Retry-After\n%s", resp.StatusCode, resp.Header.Get("Retry-After"), problemOf(body))
	}
	// The stylesheet needs no database.
	if status, _ := f.get(t, "/admin/static/style.css"); status != http.StatusOK {
		t.Fatalf("the stylesheet while the limit is reached: %d", status)
	}
	close(g.open)
	if status := <-first; status != http.StatusOK {
		t.Fatalf("the request in flight: %d", status)
	}
	if status, body := f.get(t, "/admin/"); status != http.StatusOK {
		t.Fatalf("after the request in flight: %d\n%s", status, problemOf(body))
	}
}

// TestViewAuthorization refuses every page to a request View refuses, and
// every change to one View refuses even when Authorize would allow it.
func TestViewAuthorization(t *testing.T) {
	var viewer atomic.Bool
	f := newFixture(t, func(*http.Request) bool { return true }, func(c *admin.Config) {
		c.View = func(*http.Request) bool { return viewer.Load() }
	})
	ids := f.seed(t, "orders", "broker down", 1)
	viewer.Store(true)
	token := f.token(t, "/admin/")
	viewer.Store(false)
	for _, p := range []string{"/admin/", "/admin/dead?group=" + sqladapters.FingerprintError("broker down").String(), fmt.Sprint("/admin/dead/", ids[0])} {
		if status, body := f.get(t, p); status != http.StatusForbidden || strings.Contains(body, "broker down") {
			t.Fatalf("GET %s refused by View: %d\n%s", p, status, body)
		}
	}
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "id": {fmt.Sprint(ids[0])}}, sameOrigin)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a change refused by View: %d, want 403", resp.StatusCode)
	}
	if _, dead := f.count(t); dead != 1 {
		t.Fatalf("dead = %d, want 1", dead)
	}
	viewer.Store(true)
	if status, body := f.get(t, "/admin/"); status != http.StatusOK || !strings.Contains(body, "broker down") {
		t.Fatalf("GET /admin/ allowed by View: %d", status)
	}
}

// TestFormToken checks what binds a form's token: this handler's key, the
// browser's cookie of this page and, when configured, the application's
// session; and the cookie's attributes over plain HTTP, over TLS and
// behind a proxy that terminates TLS.
func TestFormToken(t *testing.T) {
	f := newFixture(t, func(*http.Request) bool { return true }, func(c *admin.Config) { c.SessionCookie = "app_session" })
	ids := f.seed(t, "orders", "broker down", 2)
	u, _ := url.Parse(f.srv.URL)
	f.client.Jar.SetCookies(u, []*http.Cookie{{Name: "app_session", Value: "alice", Path: "/"}})
	resp, body := f.do(t, http.MethodGet, "/admin/", nil, nil)
	cookie := cookieNamed(resp, "millbox_admin")
	if cookie == nil || cookie.Path != "/admin/" || cookie.Secure || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("the page's cookie over plain HTTP: %+v, want millbox_admin, Path=/admin/, HttpOnly, SameSite=Strict", cookie)
	}
	token := tokenRE.FindStringSubmatch(body)[1]
	requeue := func(id int64) int {
		t.Helper()
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "id": {fmt.Sprint(id)}}, sameOrigin)
		return resp.StatusCode
	}

	// The double-submit of old: a value planted in the cookie, sent as
	// the token too.
	planted := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	jar, _ := cookiejar.New(nil)
	jar.SetCookies(u, []*http.Cookie{{Name: "millbox_admin", Value: planted, Path: "/"}, {Name: "app_session", Value: "alice", Path: "/"}})
	other := &http.Client{Jar: jar}
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/admin/requeue", strings.NewReader(url.Values{"token": {planted}, "id": {fmt.Sprint(ids[0])}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	r, err := other.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusForbidden {
		t.Fatalf("a planted cookie sent as its own token: %d, want 403", r.StatusCode)
	}
	// Another session voids the token.
	f.client.Jar.SetCookies(u, []*http.Cookie{{Name: "app_session", Value: "mallory", Path: "/"}})
	if status := requeue(ids[0]); status != http.StatusForbidden {
		t.Fatalf("the token of alice's session in mallory's: %d, want 403", status)
	}
	f.client.Jar.SetCookies(u, []*http.Cookie{{Name: "app_session", Value: "alice", Path: "/"}})
	if status := requeue(ids[0]); status != http.StatusSeeOther {
		t.Fatalf("the token in its own session: %d, want 303", status)
	}

	// Over TLS, and behind a TLS proxy: Secure, with the __Host- prefix.
	h, err := admin.New(admin.Config{DB: f.db, Dialect: f.dialect, Authorize: func(*http.Request) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	tls := httptest.NewTLSServer(mux)
	defer tls.Close()
	resp, err = tls.Client().Get(tls.URL + "/admin/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := cookieNamed(resp, "__Host-millbox_admin"); c == nil || c.Path != "/" || !c.Secure || !c.HttpOnly {
		t.Fatalf("the page's cookie over TLS: %+v, want __Host-millbox_admin, Path=/, Secure", c)
	}
	f.serve(t, admin.Config{DB: f.db, Dialect: f.dialect, Authorize: func(*http.Request) bool { return true }, BehindTLSProxy: true})
	resp, _ = f.do(t, http.MethodGet, "/admin/", nil, nil)
	if c := cookieNamed(resp, "__Host-millbox_admin"); c == nil || c.Path != "/" || !c.Secure {
		t.Fatalf("the page's cookie behind a TLS proxy: %+v, want __Host-millbox_admin, Path=/, Secure", c)
	}
}

func cookieNamed(resp *http.Response, name string) *http.Cookie {
	for _, c := range resp.Cookies() {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func TestMountedUnderPrefix(t *testing.T) {
	f := newFixture(t, nil)
	mux := http.NewServeMux()
	h, err := admin.New(admin.Config{DB: f.db, Dialect: f.dialect})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/ops/admin/", http.StripPrefix("/ops/admin", h))
	mux.Handle("/ops/admin", http.StripPrefix("/ops/admin", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	resp, err := f.client.Get(srv.URL + "/ops/admin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusMovedPermanently || loc != "admin/" {
		t.Fatalf("GET /ops/admin: %d Location %q, want 301 to admin/", resp.StatusCode, loc)
	}
	for _, p := range []string{"/ops/admin/", "/ops/admin/static/style.css"} {
		resp, err := f.client.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", p, resp.StatusCode)
		}
	}
	resp, err = f.client.Get(srv.URL + "/ops/admin/dead/12345")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `href="../static/style.css"`) {
		t.Fatalf("GET a missing dead letter: %d, want 404 with relative links\n%s", resp.StatusCode, b)
	}
}

func TestErrorGroupIsExact(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixtureOn(t, b, func(*http.Request) bool { return true })
			testErrorGroupIsExact(t, f)
		})
	}
}

func testErrorGroupIsExact(t *testing.T, f *fixture) {
	f.seed(t, "orders", "timeout", 2)
	f.seed(t, "invoices", "read timeout", 1)
	group := sqladapters.FingerprintError("timeout").String()

	token := f.token(t, "/admin/")
	status, list := f.get(t, "/admin/dead?group="+group)
	if status != http.StatusOK || strings.Count(list, `<tr data-id=`) != 2 {
		t.Fatalf("group list of %q: %d, want the 2 rows of that exact error\n%s", "timeout", status, list)
	}
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {group}}, sameOrigin)
	if loc := resp.Header.Get("Location"); loc != "./?requeued=2" {
		t.Fatalf("requeue of group %q: Location %q, want ./?requeued=2", "timeout", loc)
	}
	if pending, dead := f.count(t); pending != 2 || dead != 1 {
		t.Fatalf("after requeue: pending=%d dead=%d, want 2 and 1 (read timeout untouched)", pending, dead)
	}
}

func TestDeadLetterPage(t *testing.T) {
	f := newFixture(t, func(*http.Request) bool { return true })
	f.seed(t, "webhooks", scriptError, 1)

	_, body := f.get(t, "/admin/dead?group="+sqladapters.FingerprintError(scriptError).String())
	m := regexp.MustCompile(`href="\./dead/(\d+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("group list has no link to the message:\n%s", body)
	}
	id := m[1]
	status, page := f.get(t, "/admin/dead/"+id)
	if status != http.StatusOK {
		t.Fatalf("GET /admin/dead/%s: %d\n%s", id, status, page)
	}
	for _, want := range []string{
		`&lt;script&gt;alert(1)&lt;/script&gt;`, // payload, indented JSON
		`upstream said &lt;script&gt;`,          // error
		`href="../static/style.css"`,            // relative to the mount
		`action="../discard"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("message page lacks %s", want)
		}
	}
	if strings.Contains(page, "<script>") {
		t.Fatal("message page contains an unescaped <script>")
	}

	token := tokenRE.FindStringSubmatch(page)[1]
	resp, _ := f.post(t, "/admin/discard", url.Values{"token": {token}, "id": {id}, "confirm": {"yes"}}, sameOrigin)
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "./?discarded=1" {
		t.Fatalf("discard: %d Location %q, want 303 to ./?discarded=1", resp.StatusCode, loc)
	}
	if status, _ := f.get(t, "/admin/dead/"+id); status != http.StatusNotFound {
		t.Fatalf("discarded message page: %d, want 404", status)
	}
}

func TestGroupListPages(t *testing.T) {
	f := newFixture(t, nil, func(c *admin.Config) { c.PageSize = 2 })
	f.seed(t, "orders", "timeout", 3)
	f.seed(t, "invoices", "read timeout", 2)
	group := sqladapters.FingerprintError("timeout").String()

	next := regexp.MustCompile(`href="\./dead\?group=` + group + `&amp;after=(\d+)"`)
	_, first := f.get(t, "/admin/dead?group="+group)
	m := next.FindStringSubmatch(first)
	if n := strings.Count(first, `<tr data-id=`); n != 2 || m == nil {
		t.Fatalf("first page: %d rows, next link %v; want 2 rows and a next link\n%s", n, m, first)
	}
	_, second := f.get(t, "/admin/dead?group="+group+"&after="+m[1])
	if n := strings.Count(second, `<tr data-id=`); n != 1 || next.MatchString(second) {
		t.Fatalf("second page: %d rows; want 1 and no next link\n%s", n, second)
	}
	// A filter pages the same way, and keeps itself in the link.
	_, filtered := f.get(t, "/admin/dead?error=timeout")
	if n := strings.Count(filtered, `<tr data-id=`); n != 2 || !strings.Contains(filtered, `href="./dead?error=timeout&amp;after=`) {
		t.Fatalf("filtered page: %d rows\n%s", n, filtered)
	}
}

// TestLongFieldsShortened dead-letters a message whose error, topic and
// key are a mebibyte each: the pages stay small, a form carries the
// group's fingerprint instead of the text, the requeue of the group from
// the page works, and the message page shows every field whole a click
// away.
func TestLongFieldsShortened(t *testing.T) {
	f := newFixture(t, func(*http.Request) bool { return true })
	long := strings.Repeat("e", 1<<20)
	ctx := context.Background()
	msg := sqladapters.OutboxMessage{Topic: strings.Repeat("t", 1<<20), UUID: "big", Payload: []byte(strings.Repeat("p", 1<<20)),
		Metadata: []byte(`{}`), Key: strings.Repeat("k", 1<<20), KeyHash: 1}
	if err := f.dialect.InsertOutbox(ctx, f.db, []sqladapters.OutboxMessage{msg}); err != nil {
		t.Fatal(err)
	}
	rows, err := f.dialect.ReadPending(ctx, f.db, sqladapters.PendingQuery{Limit: 1}, false)
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	if _, err := f.dialect.RecordFailure(ctx, f.db, sqladapters.Failure{ID: rows[0].ID, Attempts: 1, Error: long, Dead: true}); err != nil {
		t.Fatal(err)
	}
	group := sqladapters.FingerprintError(long).String()
	for _, p := range []string{"/admin/", "/admin/dead?group=" + group, fmt.Sprint("/admin/dead/", rows[0].ID)} {
		status, body := f.get(t, p)
		if status != http.StatusOK || len(body) > 400<<10 {
			t.Fatalf("GET %s: %d, %d bytes; want a page far below the fields' 3 MiB", p, status, len(body))
		}
		for _, m := range regexp.MustCompile(`(?:value|data-[a-z]+)="([^"]*)"`).FindAllStringSubmatch(body, -1) {
			if len(m[1]) > 300 {
				t.Fatalf("GET %s: an attribute holds %d bytes", p, len(m[1]))
			}
		}
	}
	_, full := f.get(t, fmt.Sprint("/admin/dead/", rows[0].ID, "?full=1"))
	if strings.Count(full, long) != 1 || !strings.Contains(full, msg.Key) || !strings.Contains(full, msg.Topic) || !strings.Contains(full, string(msg.Payload)) {
		t.Fatalf("the message page with full=1 does not show every field whole (%d bytes)", len(full))
	}
	token := f.token(t, "/admin/")
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "group": {group}}, sameOrigin)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "./?requeued=1" {
		t.Fatalf("requeue of the long error's group: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}

// TestControlCharactersShown dead-letters a message whose error and key
// hold terminal escape sequences and a bidirectional override: the pages
// show them as escapes.
func TestControlCharactersShown(t *testing.T) {
	f := newFixture(t, nil)
	hostile := "boom \x1b[2J\x1b]0;PWNED\x07 \u202egnp.exe"
	ids := f.seed(t, "orders", hostile, 1)
	for _, p := range []string{"/admin/", "/admin/dead?group=" + sqladapters.FingerprintError(hostile).String(), fmt.Sprint("/admin/dead/", ids[0])} {
		_, body := f.get(t, p)
		if strings.ContainsAny(body, "\x1b\x07\u202e") || !strings.Contains(body, `boom \x1b[2J\x1b]0;PWNED\x07 \u202egnp.exe`) {
			t.Fatalf("GET %s does not escape the control characters:\n%q", p, body)
		}
	}
}

// TestOverviewWarnsAndNames checks the header names the database, schema
// and tables, and the warnings: an old oldest pending age, dead letters,
// no forwarder holding a partition; each can be turned off.
func TestOverviewWarnsAndNames(t *testing.T) {
	f := newFixture(t, nil, func(c *admin.Config) { c.Warnings.PendingAge = time.Millisecond })
	_, body := f.get(t, "/admin/")
	schema := f.dialect.(*postgres.Dialect).Schema()
	for _, want := range []string{`<span class="database">postgres</span>`, `<code class="schema">` + schema + `</code>`,
		`<code class="outbox">millbox_outbox</code>`, `<code class="inbox">millbox_inbox</code>`, `id="warn-no-forwarder"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("the overview lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, `id="warn-dead"`) || strings.Contains(body, `id="warn-pending"`) {
		t.Fatal("warnings on an empty outbox")
	}
	f.seed(t, "orders", "broker down", 1)
	if err := f.dialect.InsertOutbox(context.Background(), f.db, []sqladapters.OutboxMessage{{Topic: "t", UUID: "p", Payload: []byte{}, Metadata: []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	// A scheduled message is counted on its own, with its due time.
	due := time.Now().Add(time.Hour)
	if err := f.dialect.InsertOutbox(context.Background(), f.db, []sqladapters.OutboxMessage{{Topic: "later", UUID: "s", Payload: []byte{}, Metadata: []byte(`{}`), DueAt: due}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	_, body = f.get(t, "/admin/")
	for _, want := range []string{`id="warn-pending"`, `id="warn-dead"`, `class="oldest warn"`, `class="dead warn"`, `<th>Scheduled</th>`,
		`<tr data-topic="later">`, `<td class="scheduled" title="next due `} {
		if !strings.Contains(body, want) {
			t.Fatalf("the overview lacks %s:\n%s", want, body)
		}
	}
	if err := f.dialect.EnsurePartitions(context.Background(), f.db, 2); err != nil {
		t.Fatal(err)
	}
	if err := f.dialect.ClaimPartitions(context.Background(), f.db, "worker-1", time.Minute, 2); err != nil {
		t.Fatal(err)
	}
	if _, body = f.get(t, "/admin/"); strings.Contains(body, `id="warn-no-forwarder"`) {
		t.Fatal("the overview warns of no forwarder while one holds the partitions")
	}
	f.serve(t, admin.Config{DB: f.db, Dialect: f.dialect, Warnings: admin.Warnings{PendingAge: -1, DeadLetters: 5}})
	if _, body = f.get(t, "/admin/"); strings.Contains(body, `class="warning"`) {
		t.Fatalf("warnings turned off, yet:\n%s", body)
	}
	// Auto-refresh: off by default, on by the page's link.
	if strings.Contains(body, `http-equiv="refresh"`) {
		t.Fatal("the overview refreshes without being asked")
	}
	if _, body = f.get(t, "/admin/?refresh=10"); !strings.Contains(body, `<meta http-equiv="refresh" content="10; url=./?refresh=10">`) {
		t.Fatalf("refresh=10 does not refresh:\n%s", body)
	}
}

// TestRequeuedRowWaitsFromRequeue shows a requeued dead letter created an
// hour ago as waiting for moments, not an hour.
func TestRequeuedRowWaitsFromRequeue(t *testing.T) {
	pool := pgtest.Pool(t)
	db := pgxv5.WrapPool(pool)
	d := pgtest.Dialect(t, db, pool, postgres.Options{})
	f := &fixture{logs: &logBuffer{t: t}, db: db, dialect: d}
	f.serve(t, admin.Config{DB: db, Dialect: d, Authorize: func(*http.Request) bool { return true }})
	ids := f.seed(t, "orders", "broker down", 1)
	if _, err := pool.Exec(context.Background(), `UPDATE `+d.OutboxTable()+` SET created_at = created_at - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	token := f.token(t, "/admin/")
	if resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "id": {fmt.Sprint(ids[0])}}, sameOrigin); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("requeue: %d", resp.StatusCode)
	}
	_, body := f.get(t, "/admin/")
	m := regexp.MustCompile(`<tr data-topic="orders">(?s:.*?)<td class="oldest">([^<]*)</td>`).FindStringSubmatch(body)
	if m == nil || strings.Contains(m[1], "h") || strings.Contains(m[1], "m ") {
		t.Fatalf("the requeued row's oldest pending age: %v\n%s", m, body)
	}
}

func TestParamErrorsNameControlCharacters(t *testing.T) {
	f := newFixture(t, nil)
	_, body := f.get(t, "/admin/dead?"+url.QueryEscape("\x1b[2J")+"=1")
	if !bytes.Contains([]byte(body), []byte(`parameter &#34;\x1b[2J&#34;`)) {
		t.Fatalf("the unknown parameter is not named with its control character escaped:\n%s", problemOf(body))
	}
}

// TestHeldKeysShown lists the keys held by dead letters on the overview,
// with the messages waiting behind each and a link to the dead letter,
// whose page says it holds its key; requeueing it releases the key. An
// outbox without held keys shows neither the list nor its warning.
func TestHeldKeysShown(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f := newFixtureOn(t, b, func(*http.Request) bool { return true })
			ctx := context.Background()
			f.seed(t, "orders", "broker down", 1)
			if _, body := f.get(t, "/admin/"); strings.Contains(body, `id="held"`) || strings.Contains(body, `id="warn-held"`) {
				t.Fatalf("held keys shown without any:\n%s", body)
			}
			msgs := make([]sqladapters.OutboxMessage, 4)
			for i := range msgs {
				msgs[i] = sqladapters.OutboxMessage{Topic: "orders", UUID: fmt.Sprint("held-", i), Payload: []byte{}, Metadata: []byte(`{}`), Key: "customer <7>", KeyHash: 7}
			}
			if err := f.dialect.InsertOutbox(ctx, f.db, msgs); err != nil {
				t.Fatal(err)
			}
			rows, err := f.dialect.ReadPending(ctx, f.db, sqladapters.PendingQuery{Limit: 10}, false)
			if err != nil || len(rows) != 4 {
				t.Fatalf("pending: %d rows, %v", len(rows), err)
			}
			dead := rows[1].ID
			if _, err := f.dialect.RecordFailure(ctx, f.db, sqladapters.Failure{ID: dead, Attempts: 3, Error: "refused", Dead: true, Hold: true}); err != nil {
				t.Fatal(err)
			}
			_, body := f.get(t, "/admin/")
			row := regexp.MustCompile(`<tr data-key="customer &lt;7&gt;"><td><code>customer &lt;7&gt;</code></td><td><a href="\./dead/(\d+)">\d+</a></td><td class="waiting">(\d+)</td></tr>`).FindStringSubmatch(body)
			if row == nil || row[1] != fmt.Sprint(dead) || row[2] != "2" || !strings.Contains(body, `id="warn-held"`) {
				t.Fatalf("the overview does not list the held key with its dead letter %d and 2 waiting messages:\n%s", dead, body)
			}
			if _, page := f.get(t, "/admin/dead/"+row[1]); !strings.Contains(page, `id="letter-holds"`) {
				t.Fatalf("the dead letter's page does not say it holds its key:\n%s", page)
			}
			token := f.token(t, "/admin/")
			if resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "id": {row[1]}}, sameOrigin); resp.StatusCode != http.StatusSeeOther {
				t.Fatalf("requeue: %d", resp.StatusCode)
			}
			if _, body := f.get(t, "/admin/"); strings.Contains(body, `id="held"`) || strings.Contains(body, `id="warn-held"`) {
				t.Fatalf("held keys shown after the requeue:\n%s", body)
			}
		})
	}
}
