// Package admin serves an operator's page for a millbox installation: an
// http.Handler an application mounts in its own HTTP server, next to its
// metrics and health endpoints.
//
// The page names the database, schema and tables it shows; then, per
// topic, the pending rows and how long the oldest has waited (a requeued
// row waits from its requeue); the dead letters grouped by their last
// error, each group and each message with its payload, metadata and
// error; the keys held by dead letters
// (forwarder.Config.DeadLetterHoldsKey) with the messages waiting behind
// each; the inbox consumers; and which forwarder instance holds which
// partition lease. It warns, per Config.Warnings, when the oldest pending
// message is old, when dead letters wait, when they hold keys, and when
// no forwarder holds a partition, and can reload itself (Config.Refresh,
// or the page's links).
// It reads through sqladapters/ops, so it works on every database millbox
// supports.
//
// # What the embedding application must do
//
// The page shows payloads and errors, which may hold personal data or
// secrets, and can requeue and discard messages: one dead letter or one
// error group per form, never every dead letter at once (the millbox
// command does that, with --all). The handler has no login of its own:
//
//   - Mount it behind the application's login, and say who may look in
//     Config.View (everybody who reaches the handler, when nil).
//   - Grant changes to an operator role only, in Config.Authorize (without
//     it the page is read-only).
//   - Serve it over HTTPS. When a proxy terminates TLS, set
//     Config.BehindTLSProxy so that its cookie is Secure and __Host-
//     prefixed; with several replicas, give them one Config.FormKey; name
//     the login cookie in Config.SessionCookie to bind forms to the login
//     session.
//
// For example:
//
//	h, err := admin.New(admin.Config{
//		DB:            pgxv5.WrapPool(pool),
//		Dialect:       dialect,
//		View:          func(r *http.Request) bool { return user(r) != nil },
//		Authorize:     func(r *http.Request) bool { return user(r).IsOperator() },
//		SessionCookie: "session",
//		FormKey:       formKey, // 32 random bytes, the same on every replica
//	})
//	mux.Handle("/admin/", http.StripPrefix("/admin", requireLogin(h)))
//
// The handler uses relative links only, so it works under any prefix.
// examples/admin runs it behind a stand-in login.
//
// # What the handler guards itself
//
// Everything from a request is checked before it reaches the database:
// a parameter the page does not take, given twice, or with a value that is
// not what it takes (text that is not UTF-8, holds NUL or is long; a
// number out of range; an error group that is not a fingerprint) is
// answered 400 Bad Request naming it. A failure of the database is
// answered with a generic page and a reference id; the detail goes to
// Config.Logger once per cause, not once per request. At most
// Config.MaxConcurrent requests read or change the database at once;
// more are answered 503 Service Unavailable with Retry-After.
//
// Error groups are addressed by the fingerprint of their error
// (sqladapters.ErrorFingerprint), never by the text, and a group's page
// reads only that group, through an index, without payloads; listing
// pages never read payloads. Long fields are cut on the page, with the
// whole one click away, and control characters of texts from the
// database are shown as escapes.
//
// Changes are POST requests only; the handler answers each with a
// redirect back to the page, which reports how many rows changed. Two
// independent checks stop forged changes:
//
//   - net/http.CrossOriginProtection refuses unsafe requests whose
//     Sec-Fetch-Site header is not same-origin, or, for browsers that do
//     not send it, whose Origin header does not match the Host. Origins
//     of a reverse proxy that rewrites the Host are trusted with
//     Config.TrustedOrigins.
//   - Every form carries a token: an HMAC, under Config.FormKey, of a
//     random value the browser holds in an HttpOnly, SameSite=Strict
//     cookie of this page (and of the login session cookie, when
//     Config.SessionCookie names it). Another site can read neither, a
//     value it plants in the cookie yields no token, and a token does not
//     fit another browser or another login.
//
// Every response also forbids framing (against clickjacking) and carries
// a Content-Security-Policy that allows no script at all: the page has
// none, so markup smuggled into a payload or an error could not run even
// if escaping failed. Payloads, metadata, keys, topics and errors are
// attacker-controlled and are always escaped by html/template.
package admin
