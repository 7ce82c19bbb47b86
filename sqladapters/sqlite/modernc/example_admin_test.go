package modernc_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/sqlite/modernc"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// admin.New on SQLite: mount the admin page under /admin/ of the
// application's server, behind its login. Only requests View allows may
// look, and only those Authorize allows too may requeue or discard.
func Example_adminPage() {
	dir, err := os.MkdirTemp("", "millbox-admin-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sqlDB, err := modernc.Open(filepath.Join(dir, "app.db"), modernc.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	db, dialect := stdsql.WrapDB(sqlDB), sqlite.MustNew(sqlite.Options{})
	if err := sqladapters.Migrate(context.Background(), db, dialect); err != nil {
		log.Fatal(err)
	}

	page, err := admin.New(admin.Config{
		DB:      db,
		Dialect: dialect,
		// The application's own checks, such as a role in its session.
		View:      func(r *http.Request) bool { return r.Header.Get("X-Role") != "" },
		Authorize: func(r *http.Request) bool { return r.Header.Get("X-Role") == "operator" },
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", page))

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/admin/", nil)
	req.Header.Set("X-Role", "viewer")
	mux.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Content-Type"))
	// Output: 200 text/html; charset=utf-8
}
