package admin_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
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
	// from MILLBOX_MYSQL_DSN. The command's tests run the same operations
	// on SQLite.
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
	f := &fixture{}
	f.db, f.dialect = b.open(t)
	cfg := admin.Config{DB: f.db, Dialect: f.dialect, Authorize: authorize, Logger: testLogger(t)}
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
	return f
}

// seed writes n outbox rows of topic and makes them dead with errText.
func (f *fixture) seed(t *testing.T, topic, errText string, n int) {
	t.Helper()
	ctx := context.Background()
	msgs := make([]sqladapters.OutboxMessage, n)
	for i := range msgs {
		msgs[i] = sqladapters.OutboxMessage{Topic: topic, UUID: topic + "-" + string(rune('a'+i)),
			Payload: []byte(`{"note":"<script>alert(1)</script>"}`), Metadata: []byte(`{}`)}
	}
	if err := f.dialect.InsertOutbox(ctx, f.db, msgs); err != nil {
		t.Fatal(err)
	}
	rows, err := f.dialect.ReadPending(ctx, f.db, sqladapters.PendingQuery{Limit: 1000}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if r.Topic != topic {
			continue
		}
		if _, err := f.dialect.RecordFailure(ctx, f.db, sqladapters.Failure{ID: r.ID, Attempts: 1, Error: errText, Dead: true}); err != nil {
			t.Fatal(err)
		}
	}
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
	resp, err := f.client.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post sends a form as a same-origin browser would, adding headers.
func (f *fixture) post(t *testing.T, path string, form url.Values, headers map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
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

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), nil))
}

var tokenRE = regexp.MustCompile(`name="token" value="([^"]+)"`)

var sameOrigin = map[string]string{"Sec-Fetch-Site": "same-origin"}

func TestConfigRejected(t *testing.T) {
	d := sqlite.MustNew(sqlite.Options{})
	for _, tc := range []struct {
		name string
		cfg  admin.Config
		want string
	}{
		{"no DB", admin.Config{Dialect: d}, "Config.DB"},
		{"no dialect", admin.Config{DB: stdsql.WrapDB(nil)}, "Config.Dialect"},
		{"page size", admin.Config{DB: stdsql.WrapDB(nil), Dialect: d, PageSize: 5000}, "Config.PageSize"},
		{"origin", admin.Config{DB: stdsql.WrapDB(nil), Dialect: d, TrustedOrigins: []string{"not an origin"}}, "Config.TrustedOrigins"},
		{"dialect without operations", admin.Config{DB: stdsql.WrapDB(nil), Dialect: struct{ sqladapters.Dialect }{d}}, "Config.Dialect"},
		{"negative timeout", admin.Config{DB: stdsql.WrapDB(nil), Dialect: d, Timeout: -time.Second}, "Config.Timeout"},
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
	f.client.Jar.SetCookies(u, []*http.Cookie{{Name: "millbox_admin_token", Value: tok, Path: "/"}})
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {tok}, "error": {"broker down"}}, sameOrigin)
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

	status, body := f.get(t, "/admin/")
	if status != http.StatusOK {
		t.Fatalf("GET /admin/: %d\n%s", status, body)
	}
	m := tokenRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("authorized page has no form token:\n%s", body)
	}
	token := m[1]

	t.Run("escapes attacker-controlled text", func(t *testing.T) {
		if strings.Contains(body, "<script>") {
			t.Fatalf("page contains an unescaped <script>:\n%s", body)
		}
		if !strings.Contains(body, "&lt;script&gt;document.title=") {
			t.Fatal("the error text is missing from the page")
		}
	})

	t.Run("no token", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"error": {"broker down"}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue without token: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("wrong token", func(t *testing.T) {
		wrong := "A" + token[1:]
		if token[0] == 'A' {
			wrong = "B" + token[1:]
		}
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {wrong}, "error": {"broker down"}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue with a wrong token: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("cross-site", func(t *testing.T) {
		resp, body := f.post(t, "/admin/requeue", url.Values{"token": {token}, "error": {"broker down"}},
			map[string]string{"Sec-Fetch-Site": "cross-site"})
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "Cross-origin") {
			t.Fatalf("cross-site requeue: %d, want 403\n%s", resp.StatusCode, body)
		}
	})
	t.Run("foreign origin", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "error": {"broker down"}},
			map[string]string{"Origin": "https://evil.example"})
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue from another origin: %d, want 403", resp.StatusCode)
		}
	})
	t.Run("authorization withdrawn", func(t *testing.T) {
		deny.Store(true)
		defer deny.Store(false)
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "error": {"broker down"}}, sameOrigin)
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("requeue without authorization: %d, want 403", resp.StatusCode)
		}
	})
	if pending, dead := f.count(t); pending != 0 || dead != 4 {
		t.Fatalf("after refused changes: pending=%d dead=%d, want 0 and 4", pending, dead)
	}

	t.Run("requeue group", func(t *testing.T) {
		resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "error": {"broker down"}}, sameOrigin)
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
		resp, _ := f.post(t, "/admin/discard", url.Values{"token": {token}, "error": {scriptError}}, sameOrigin)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("unconfirmed discard: %d, want 400", resp.StatusCode)
		}
		resp, _ = f.post(t, "/admin/discard", url.Values{"token": {token}, "error": {scriptError}, "confirm": {"yes"}}, sameOrigin)
		if resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("discard: %d, want 303", resp.StatusCode)
		}
		if _, dead := f.count(t); dead != 0 {
			t.Fatalf("after discard: dead=%d, want 0", dead)
		}
	})
}

func TestMountedUnderPrefix(t *testing.T) {
	f := newFixture(t, nil)
	mux := http.NewServeMux()
	h, err := admin.New(admin.Config{DB: f.db, Dialect: f.dialect, Logger: testLogger(t)})
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

	_, body := f.get(t, "/admin/")
	token := tokenRE.FindStringSubmatch(body)[1]
	status, list := f.get(t, "/admin/dead?error=timeout")
	if status != http.StatusOK || strings.Count(list, `<tr data-id=`) != 2 {
		t.Fatalf("group list of %q: %d, want the 2 rows of that exact error\n%s", "timeout", status, list)
	}
	resp, _ := f.post(t, "/admin/requeue", url.Values{"token": {token}, "error": {"timeout"}}, sameOrigin)
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

	_, body := f.get(t, "/admin/dead?error="+url.QueryEscape(scriptError))
	m := regexp.MustCompile(`href="\.\./dead/(\d+)"|href="dead/(\d+)"|href="\./dead/(\d+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("group list has no link to the message:\n%s", body)
	}
	id := m[1] + m[2] + m[3]
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

	next := regexp.MustCompile(`href="\./dead\?error=timeout&amp;after=(\d+)"`)
	_, first := f.get(t, "/admin/dead?error=timeout")
	m := next.FindStringSubmatch(first)
	if n := strings.Count(first, `<tr data-id=`); n != 2 || m == nil {
		t.Fatalf("first page: %d rows, next link %v; want 2 rows and a next link\n%s", n, m, first)
	}
	_, second := f.get(t, "/admin/dead?error=timeout&after="+m[1])
	if n := strings.Count(second, `<tr data-id=`); n != 1 || next.MatchString(second) {
		t.Fatalf("second page: %d rows; want 1 and no next link\n%s", n, second)
	}
}
