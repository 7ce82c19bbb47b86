package admin_test

import (
	"context"
	"log"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/sqladapters/admin"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// Mount the admin page under /admin/ of the application's server, behind
// its login: every signed-in user may look, operators may requeue and
// discard. Example_adminPage of package sqladapters/sqlite/modernc runs
// this on SQLite; examples/admin in the repository serves it.
func ExampleNew() {
	pool, err := pgxpool.New(context.Background(), "postgres://localhost:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// The application's own session check.
	role := func(r *http.Request) string { return r.Header.Get("X-Role") }

	page, err := admin.New(admin.Config{
		DB:            pgxv5.WrapPool(pool),
		Dialect:       postgres.MustNew(postgres.Options{}),
		View:          func(r *http.Request) bool { return role(r) != "" },
		Authorize:     func(r *http.Request) bool { return role(r) == "operator" },
		SessionCookie: "session", // forms are bound to the login session
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", page))
	log.Fatal(http.ListenAndServeTLS(":8443", "cert.pem", "key.pem", mux))
}
