package admin

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

//go:embed templates/*.html static/*
var files embed.FS

// retryAfter is what a request refused for the concurrency limit is told
// to wait, in seconds.
const retryAfter = "2"

// handler serves the page. Its routes, relative to where it is mounted:
//
//	GET  /            overview: topics, error groups, partitions, inbox
//	GET  /dead        dead letters of one error group (?group=) or of a
//	                  filter (?topic=, ?key=, ?error=), a page at a time
//	                  (&after=)
//	GET  /dead/{id}   one dead letter (?full=1 shows long fields whole)
//	POST /requeue     requeue one dead letter (id) or a group (group)
//	POST /discard     delete one dead letter or a group, with confirm=yes
//	GET  /static/     the stylesheet
type handler struct {
	cfg       Config
	store     *store
	pages     *template.Template
	mux       *http.ServeMux
	key       []byte
	slots     chan struct{}
	incidents *incidents
	// outer checks cross-origin requests before mux sees them.
	outer http.Handler
}

// New returns the admin page for cfg. It checks cfg but not the
// database: a page whose tables are missing says so, with how to create
// them.
func New(cfg Config) (http.Handler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	st, err := newStore(cfg)
	if err != nil {
		return nil, err
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(files, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("admin: parse templates: %w", err)
	}
	h := &handler{
		cfg:       cfg,
		store:     st,
		pages:     pages,
		mux:       http.NewServeMux(),
		key:       cfg.FormKey,
		slots:     make(chan struct{}, cfg.MaxConcurrent),
		incidents: newIncidents(cfg.Logger),
	}
	if h.key == nil {
		h.key = make([]byte, MinFormKeyBytes)
		_, _ = rand.Read(h.key) // never fails
	}
	static, _ := fs.Sub(files, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
	h.mux.HandleFunc("GET /{$}", h.read(h.overview, "requeued", "discarded", "refresh"))
	h.mux.HandleFunc("GET /dead", h.read(h.deadList, "group", "topic", "key", "error", "after"))
	h.mux.HandleFunc("GET /dead/{id}", h.read(h.deadLetter, "full"))
	h.mux.HandleFunc("POST /requeue", h.change(actionRequeue))
	h.mux.HandleFunc("POST /discard", h.change(actionDiscard))
	h.mux.HandleFunc("/", h.notFound)

	cop := http.NewCrossOriginProtection()
	for _, o := range cfg.TrustedOrigins {
		_ = cop.AddTrustedOrigin(o) // checked by Validate
	}
	cop.SetDenyHandler(http.HandlerFunc(h.crossOrigin))
	h.outer = cop.Handler(h.mux)
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if r.URL.Path == "" {
		// Mounted with StripPrefix("/admin") and asked for "/admin":
		// relative links need the trailing slash.
		target := path.Base(requestPath(r)) + "/"
		if r.URL.RawQuery != "" && len(r.URL.RawQuery) <= maxQueryBytes {
			target += "?" + r.URL.RawQuery
		}
		w.Header().Set("Location", target)
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	h.outer.ServeHTTP(w, r)
}

// requestPath is the path the client asked for, before any StripPrefix.
func requestPath(r *http.Request) string {
	if u, err := url.ParseRequestURI(r.RequestURI); err == nil && u.Path != "" {
		return u.Path
	}
	return r.URL.Path
}

// root is the relative reference from the request's path to where the
// handler is mounted: "./" for "/", "../" for "/dead/7".
func root(r *http.Request) string {
	depth := strings.Count(strings.TrimPrefix(r.URL.Path, "/"), "/")
	if depth == 0 {
		return "./"
	}
	return strings.Repeat("../", depth)
}

func securityHeaders(hd http.Header) {
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "same-origin")
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// viewable reports whether the request may see the page.
func (h *handler) viewable(r *http.Request) bool { return h.cfg.View == nil || h.cfg.View(r) }

// allowed reports whether the request may change anything.
func (h *handler) allowed(r *http.Request) bool {
	return h.cfg.Authorize != nil && h.viewable(r) && h.cfg.Authorize(r)
}

// read wraps a page that reads the database: the request must be
// viewable, its query must hold only the names given, valid, and a slot
// of the concurrency limit must be free.
func (h *handler) read(page func(http.ResponseWriter, *http.Request, params), names ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.viewable(r) {
			h.forbidden(w, r)
			return
		}
		if len(r.URL.RawQuery) > maxQueryBytes {
			h.badRequest(w, r, fmt.Errorf("the address's query is longer than %d bytes", maxQueryBytes))
			return
		}
		q, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			h.badRequest(w, r, errors.New("the address's query is not well formed"))
			return
		}
		p, err := parseParams(q, names...)
		if err != nil {
			h.badRequest(w, r, err)
			return
		}
		if !h.acquire(w, r) {
			return
		}
		defer h.release()
		page(w, r, p)
	}
}

// acquire takes a slot of the concurrency limit, or answers 503.
func (h *handler) acquire(w http.ResponseWriter, r *http.Request) bool {
	select {
	case h.slots <- struct{}{}:
		return true
	default:
		w.Header().Set("Retry-After", retryAfter)
		h.fail(w, r, http.StatusServiceUnavailable, "Busy", "Other requests are reading the database right now. Try again in a moment.")
		return false
	}
}

func (h *handler) release() { <-h.slots }

// page is what every template receives.
type page struct {
	Title string
	Where where
	Root  string
	// CanChange shows the buttons; Token goes into every form.
	CanChange bool
	Token     string
	Notice    string
	Now       time.Time
	// Refresh reloads the page every Refresh seconds when positive.
	Refresh int64
	Data    any
}

func (h *handler) newPage(ctx context.Context, w http.ResponseWriter, r *http.Request, data any) page {
	p := page{
		Title: h.cfg.Title,
		Where: h.store.location(ctx),
		Root:  root(r),
		Now:   time.Now().UTC(),
		Data:  data,
	}
	if h.allowed(r) {
		p.CanChange = true
		p.Token = h.formToken(w, r)
	}
	return p
}

// render executes a template into a buffer first, so that a failure
// yields a clean error page rather than half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name, p); err != nil {
		ref := h.incidents.report(r.URL.Path, fmt.Errorf("render %s: %w", name, err))
		http.Error(w, "millbox admin: cannot render the page (reference "+ref+")", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = buf.WriteTo(w)
}

// problem is the data of the error page.
type problem struct {
	Status  int
	Heading string
	Detail  string
}

// fail renders the error page. Its text comes from the handler, never
// from a driver error or a request.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, heading, detail string) {
	p := page{Title: h.cfg.Title, Where: h.store.cached(), Root: root(r), Now: time.Now().UTC(),
		Data: problem{Status: status, Heading: heading, Detail: detail}}
	h.render(w, r, status, "problem", p)
}

// serverError answers a failure of the database with a generic page and
// a reference id; the detail goes to the log once per cause.
func (h *handler) serverError(w http.ResponseWriter, r *http.Request, err error) {
	ref := h.incidents.report(r.URL.Path, err)
	status, heading, detail := http.StatusInternalServerError, "The database could not answer",
		"The request failed on the server."
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		status, heading, detail = http.StatusGatewayTimeout, "The database did not answer in time",
			"The request took longer than the page allows."
	case errors.Is(err, sqladapters.ErrMissingTable):
		heading, detail = "The millbox tables are missing",
			"Create them with `millbox migrate up` (or sqladapters.Migrate) with the names this page is configured with."
	}
	h.fail(w, r, status, heading, detail+" Reference "+ref+": the application's log has the detail.")
}

func (h *handler) badRequest(w http.ResponseWriter, r *http.Request, err error) {
	h.fail(w, r, http.StatusBadRequest, "Bad request", err.Error()+".")
}

func (h *handler) forbidden(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, http.StatusForbidden, "Not allowed", "You may not see this page.")
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, http.StatusNotFound, "Not found", "There is no page at this address.")
}

func (h *handler) crossOrigin(w http.ResponseWriter, r *http.Request) {
	h.cfg.Logger.Warn("millbox admin: refused a cross-origin request", "path", r.URL.Path,
		"origin", shorten(200, r.Header.Get("Origin")), "sec_fetch_site", shorten(40, r.Header.Get("Sec-Fetch-Site")))
	h.fail(w, r, http.StatusForbidden, "Cross-origin request refused",
		"Changes are accepted only from this page itself, not from another site.")
}

func (h *handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.Timeout)
}

// overviewData is the data of the overview page.
type overviewData struct {
	Status status
	Groups []ops.ErrorGroup
	// GroupsCut is true when more groups exist than are shown.
	GroupsCut bool
	// Held lists the keys held by dead letters, read only when the
	// status counts some; HeldCut is true when more exist than are
	// shown.
	Held    []ops.HeldKey
	HeldCut bool
	// Refresh is the reload interval in seconds, 0 when off, and
	// RefreshChoices the ones the page offers.
	Refresh        int64
	RefreshChoices []int64
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request, q params) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	d := overviewData{RefreshChoices: []int64{10, 60}}
	var err error
	if d.Status, err = h.store.status(ctx, h.cfg.Warnings); err != nil {
		h.serverError(w, r, err)
		return
	}
	if d.Groups, d.GroupsCut, err = h.store.groups(ctx, h.cfg.GroupLimit); err != nil {
		h.serverError(w, r, err)
		return
	}
	if d.Status.HeldKeys > 0 {
		if d.Held, d.HeldCut, err = h.store.held(ctx, h.cfg.GroupLimit); err != nil {
			h.serverError(w, r, err)
			return
		}
	}
	refresh := h.cfg.Refresh
	if q.refreshSet {
		refresh = q.refresh
	}
	d.Refresh = int64(refresh / time.Second)
	p := h.newPage(ctx, w, r, d)
	p.Notice = q.notice
	p.Refresh = d.Refresh
	h.render(w, r, http.StatusOK, "overview", p)
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// listData is the data of the dead-letter list page.
type listData struct {
	// Group is the error group listed, nil for a filter.
	Group *sqladapters.ErrorFingerprint
	// Query repeats the filter in the links to the next page, encoded
	// by url.Values.
	Query   template.URL
	Filter  ops.Filter
	Letters []sqladapters.DeadLetter
	// Next is the id to continue after, 0 on the last page.
	Next int64
}

// Fingerprint is the group's fingerprint for the forms.
func (d listData) Fingerprint() string { return d.Group.String() }

func (h *handler) deadList(w http.ResponseWriter, r *http.Request, q params) {
	d := listData{Group: q.group}
	v := url.Values{}
	if q.group != nil {
		if q.topic != "" || q.key != "" || q.errText != "" {
			h.badRequest(w, r, errors.New("parameter \"group\" selects an error group, which takes no other filter"))
			return
		}
		d.Filter = ops.Filter{Fingerprint: q.group}
		v.Set("group", q.group.String())
	} else {
		d.Filter = ops.Filter{Topic: q.topic, Key: q.key, ErrorContains: q.errText}
		for name, val := range map[string]string{"topic": q.topic, "key": q.key, "error": q.errText} {
			if val != "" {
				v.Set(name, val)
			}
		}
	}
	d.Query = template.URL(v.Encode()) // encoded by url.Values: safe in the link
	ctx, cancel := h.ctx(r)
	defer cancel()
	var err error
	d.Letters, d.Next, err = h.store.letters(ctx, d.Filter, q.after, h.cfg.PageSize)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	h.render(w, r, http.StatusOK, "list", h.newPage(ctx, w, r, d))
}

// letterData is the data of the page of one dead letter.
type letterData struct {
	Letter sqladapters.DeadLetter
	// Topic, UUID, Key and Error are the letter's fields as shown.
	Topic, UUID, Key, Error field
	Metadata                []metaPair
	// MetadataRaw is shown when the metadata is not a JSON object.
	MetadataRaw field
	Payload     payloadView
	// Full is true when the page shows every field whole.
	Full bool
}

// Fingerprint is the letter's group's fingerprint for the links.
func (d letterData) Fingerprint() string { return d.Letter.Fingerprint.String() }

// Cut reports whether any field is shown in part.
func (d letterData) Cut() bool {
	return d.Topic.Cut() || d.UUID.Cut() || d.Key.Cut() || d.Error.Cut() || d.MetadataRaw.Cut() || d.Payload.Cut()
}

func (h *handler) deadLetter(w http.ResponseWriter, r *http.Request, q params) {
	id, err := parseCount(r.PathValue("id"))
	if err != nil || id == 0 {
		h.notFound(w, r)
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	l, found, err := h.store.letter(ctx, id)
	if err != nil {
		h.serverError(w, r, err)
		return
	}
	if !found {
		h.fail(w, r, http.StatusNotFound, "No such dead letter",
			fmt.Sprintf("Message %d is not a dead letter: it was requeued, published or discarded.", id))
		return
	}
	max := h.cfg.MaxFieldBytes
	d := letterData{
		Letter: l, Full: q.full,
		Topic: viewField(l.Topic, max, q.full), UUID: viewField(l.UUID, max, q.full),
		Key: viewField(l.Key, max, q.full), Error: viewField(l.LastError, max, q.full),
	}
	if q.full {
		max = len(l.Payload) + len(l.Metadata) + 1
	}
	d.Payload = viewPayload(l.Payload, max)
	d.Metadata, d.MetadataRaw = viewMetadata(l.Metadata, max, q.full)
	h.render(w, r, http.StatusOK, "letter", h.newPage(ctx, w, r, d))
}

// action is a change the page offers.
type action struct {
	name string // as in the route
	past string // for the notice
	done string // query parameter of the redirect
	// confirm requires confirm=yes in the form.
	confirm bool
}

var (
	actionRequeue = action{name: "requeue", past: "Requeued", done: "requeued"}
	actionDiscard = action{name: "discard", past: "Discarded", done: "discarded", confirm: true}
)

// change handles a POST of a. CrossOriginProtection has already refused
// cross-origin browsers; here the request must be viewable and
// authorized, its form valid, and its token that of a form this handler
// rendered for this browser.
func (h *handler) change(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.viewable(r) {
			h.forbidden(w, r)
			return
		}
		if !h.allowed(r) {
			h.cfg.Logger.Warn("millbox admin: refused an unauthorized change", "action", a.name)
			h.fail(w, r, http.StatusForbidden, "Not allowed",
				"This page is read-only for you: changes need the permission the application grants.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxQueryBytes)
		if r.URL.RawQuery != "" {
			h.badRequest(w, r, errors.New("a change takes its parameters in the form, not in the address"))
			return
		}
		if err := r.ParseForm(); err != nil {
			h.badRequest(w, r, errors.New("the form is not well formed or longer than "+strconv.Itoa(maxQueryBytes)+" bytes"))
			return
		}
		p, err := parseParams(r.PostForm, tokenField, "id", "group", "confirm")
		if err != nil {
			h.badRequest(w, r, err)
			return
		}
		if !h.validToken(r, p.token) {
			h.cfg.Logger.Warn("millbox admin: refused a change without a valid form token", "action", a.name)
			h.fail(w, r, http.StatusForbidden, "Form expired",
				"The form did not carry this browser's token. Reload the page and try again.")
			return
		}
		switch {
		case p.id != 0 && p.group != nil:
			h.badRequest(w, r, errors.New("give either parameter \"id\" or \"group\", not both"))
			return
		case p.id == 0 && p.group == nil:
			h.badRequest(w, r, errors.New("the form names no message (parameter \"id\") and no error group (parameter \"group\")"))
			return
		case a.confirm && !p.confirm:
			h.fail(w, r, http.StatusBadRequest, "Not confirmed",
				"Tick the confirmation box to "+a.name+": discarded messages cannot be recovered.")
			return
		}
		if !h.acquire(w, r) {
			return
		}
		defer h.release()
		ctx, cancel := h.ctx(r)
		defer cancel()
		var n int64
		switch a {
		case actionRequeue:
			n, err = h.store.requeue(ctx, p)
		case actionDiscard:
			n, err = h.store.discard(ctx, p)
		}
		if err != nil {
			h.serverError(w, r, err)
			return
		}
		if p.group != nil {
			h.cfg.Logger.Info("millbox admin: "+a.name, "error_group", p.group.String(), "rows", n)
		} else {
			h.cfg.Logger.Info("millbox admin: "+a.name, "id", p.id, "rows", n)
		}
		// A relative Location: http.Redirect would resolve it against the
		// path StripPrefix left, which lacks the prefix.
		w.Header().Set("Location", "./?"+a.done+"="+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusSeeOther)
	}
}
