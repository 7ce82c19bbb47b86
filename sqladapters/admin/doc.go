// Package admin serves an operator's page for a millbox installation: an
// http.Handler an application mounts in its own HTTP server, next to its
// metrics and health endpoints.
//
// The page shows, per topic, the pending rows and the age of the oldest
// one; the dead letters grouped by their last error, each group and each
// message with its payload, metadata and error; the inbox consumers; and
// which forwarder instance holds which partition lease. It reads through
// sqladapters/ops, so it works on every database millbox supports.
//
// # Mounting
//
// The handler uses relative links only, so it works under any prefix:
//
//	h, err := admin.New(admin.Config{
//		DB:        pgxv5.WrapPool(pool),
//		Dialect:   dialect,
//		Authorize: func(r *http.Request) bool { return isOperator(r) },
//	})
//	mux.Handle("/admin/", http.StripPrefix("/admin", requireLogin(h)))
//
// The page shows payloads and errors, which may hold personal data: put
// it behind the application's own authentication, as requireLogin does
// above.
//
// # Changes and authorization
//
// Without Config.Authorize the page is read-only: it renders no buttons
// and refuses every POST with 403 Forbidden. With it, Authorize is asked
// on every request; when it returns true the page offers requeue and
// discard, for one message or for a whole error group, and accepts them.
// Changes are POST requests only; the handler answers each with a
// redirect back to the page, which reports how many rows changed.
//
// # Cross-site request forgery
//
// Authorize typically trusts a session cookie, which a browser attaches
// to requests that another site makes it send. Two independent checks
// stop such forged changes:
//
//   - net/http.CrossOriginProtection refuses unsafe requests whose
//     Sec-Fetch-Site header is not same-origin, or, for browsers that do
//     not send it, whose Origin header does not match the Host. Origins
//     of a reverse proxy that rewrites the Host are trusted with
//     Config.TrustedOrigins.
//   - Every form carries a token that must equal the value of a random,
//     HttpOnly, SameSite=Strict cookie the handler set when it rendered
//     the form (the double-submit pattern). A cross-site request carries
//     neither the cookie nor the value, and another site can read
//     neither. This covers old browsers that send neither header, and
//     makes a change come from a form this handler rendered. Being
//     stateless, it works with any number of application replicas.
//
// Every response also forbids framing (against clickjacking) and carries
// a Content-Security-Policy that allows no script at all: the page has
// none, so markup smuggled into a payload or an error could not run even
// if escaping failed. Payloads, metadata, keys, topics and errors are
// attacker-controlled and are always escaped by html/template.
package admin
