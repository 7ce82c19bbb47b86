package modernc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestAdminGroupOfInvalidUTF8Error requeues, from the admin page, the
// group of an error whose stored text is not UTF-8 (SQLite keeps any
// bytes; a browser turns them into U+FFFD): the form addresses the group
// by its fingerprint, so the requeue finds it.
func TestAdminGroupOfInvalidUTF8Error(t *testing.T) {
	raw, err := modernc.Open(filepath.Join(t.TempDir(), "admin.db"), modernc.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	ctx := context.Background()
	db, d := stdsql.WrapDB(raw), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatal(err)
	}
	if err := d.InsertOutbox(ctx, db, []sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte("p"), Metadata: []byte("{}")}}); err != nil {
		t.Fatal(err)
	}
	stored := "broker said \xff\xfe"
	fp := sqladapters.FingerprintError(stored)
	if _, err := d.RecordFailure(ctx, db, sqladapters.Failure{ID: 1, Attempts: 3, Error: "x", Dead: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(ctx, `UPDATE `+d.Tables()[5]+` SET last_error = CAST(? AS TEXT), error_fp = ?`, []byte(stored), fp[:]); err != nil {
		t.Fatal(err)
	}

	h, err := admin.New(admin.Config{DB: db, Dialect: d, Authorize: func(*http.Request) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", h))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := client.Get(srv.URL + "/admin/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	if !strings.Contains(page, `broker said \xff\xfe`) || !strings.Contains(page, `data-group="`+fp.String()+`"`) {
		t.Fatalf("the overview does not show the group of the error as stored:\n%s", page)
	}
	token := regexp.MustCompile(`name="token" value="([^"]+)"`).FindStringSubmatch(page)[1]
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/admin/requeue", strings.NewReader(url.Values{"token": {token}, "group": {fp.String()}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); resp.StatusCode != http.StatusSeeOther || loc != "./?requeued=1" {
		t.Fatalf("requeue of the group: %d %q, want 303 to ./?requeued=1", resp.StatusCode, loc)
	}
	st, err := d.OutboxStats(ctx, db)
	if err != nil || st.Pending != 1 || st.Dead != 0 {
		t.Fatalf("after the requeue: %+v, %v", st, err)
	}
}
