// Package browser tests the admin page (sqladapters/admin) in a real
// headless Chromium against a real PostgreSQL, driven through the
// DevTools protocol by chromedp.
//
// It is a module of its own so that chromedp stays out of the module
// graph of millbox's users. Run it from this directory, or through go.work
// from the repository's root:
//
//	go test ./...
//	go test ./integration/browser/...
//
// It needs the chromium program (the Debian package of that name; or set
// MILLBOX_CHROMIUM to a Chrome or Chromium binary) and PostgreSQL at
// MILLBOX_POSTGRES_URL (default: postgres://root@127.0.0.1:5432/test). With
// CI=true either one missing fails the test; elsewhere it skips.
//
// Every run saves a screenshot of the page as a test artifact (see go test
// -artifacts). With MILLBOX_SCREENSHOT=1 it also rewrites the illustration
// the admin package's documentation shows,
// sqladapters/admin/testdata/admin.png.
package browser
