package admin

import (
	"bytes"
	"context"
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

// maxFormBytes bounds the body of a change: a token, an id or an error
// text.
const maxFormBytes = 1 << 20

// handler serves the page. Its routes, relative to where it is mounted:
//
//	GET  /            overview: topics, error groups, partitions, inbox
//	GET  /dead        dead letters of one error group (?error=, &after=)
//	GET  /dead/{id}   one dead letter
//	POST /requeue     requeue one dead letter (id) or a group (error)
//	POST /discard     delete one dead letter or a group, with confirm=yes
//	GET  /static/     the stylesheet
type handler struct {
	cfg   Config
	store *store
	pages *template.Template
	mux   *http.ServeMux
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
	h := &handler{cfg: cfg, store: st, pages: pages, mux: http.NewServeMux()}
	static, _ := fs.Sub(files, "static")
	h.mux.Handle("GET /static/", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
	h.mux.HandleFunc("GET /{$}", h.overview)
	h.mux.HandleFunc("GET /dead", h.deadList)
	h.mux.HandleFunc("GET /dead/{id}", h.deadLetter)
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
		if r.URL.RawQuery != "" {
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

// page is what every template receives.
type page struct {
	Title   string
	Dialect string
	Root    string
	// CanChange shows the buttons; Token goes into every form.
	CanChange bool
	Token     string
	Notice    string
	Now       time.Time
	Data      any
}

func (h *handler) newPage(w http.ResponseWriter, r *http.Request, data any) page {
	p := page{
		Title:   h.cfg.Title,
		Dialect: h.store.dialectName(),
		Root:    root(r),
		Now:     time.Now().UTC(),
		Data:    data,
	}
	if h.allowed(r) {
		p.CanChange = true
		p.Token = ensureToken(w, r)
	}
	return p
}

func (h *handler) allowed(r *http.Request) bool {
	return h.cfg.Authorize != nil && h.cfg.Authorize(r)
}

// render executes a template into a buffer first, so that a failure
// yields a clean error page rather than half a page.
func (h *handler) render(w http.ResponseWriter, status int, name string, p page) {
	var buf bytes.Buffer
	if err := h.pages.ExecuteTemplate(&buf, name, p); err != nil {
		h.cfg.Logger.Error("millbox admin: render page", "template", name, "error", err)
		http.Error(w, "millbox admin: cannot render the page", http.StatusInternalServerError)
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

func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, heading, detail string) {
	p := page{Title: h.cfg.Title, Dialect: h.store.dialectName(), Root: root(r), Now: time.Now().UTC(),
		Data: problem{Status: status, Heading: heading, Detail: detail}}
	h.render(w, status, "problem", p)
}

func (h *handler) dbError(w http.ResponseWriter, r *http.Request, err error) {
	h.cfg.Logger.Error("millbox admin: database", "path", r.URL.Path, "error", err)
	status := http.StatusInternalServerError
	if errors.Is(err, context.DeadlineExceeded) {
		status = http.StatusGatewayTimeout
	}
	h.fail(w, r, status, "The database could not answer", err.Error())
}

func (h *handler) notFound(w http.ResponseWriter, r *http.Request) {
	h.fail(w, r, http.StatusNotFound, "Not found", "There is no page at this address.")
}

func (h *handler) crossOrigin(w http.ResponseWriter, r *http.Request) {
	h.cfg.Logger.Warn("millbox admin: refused a cross-origin request", "path", r.URL.Path,
		"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
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
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	var d overviewData
	var err error
	if d.Status, err = h.store.status(ctx); err != nil {
		h.dbError(w, r, err)
		return
	}
	if d.Groups, d.GroupsCut, err = h.store.groups(ctx, h.cfg.GroupLimit); err != nil {
		h.dbError(w, r, err)
		return
	}
	p := h.newPage(w, r, d)
	p.Notice = notice(r.URL.Query())
	h.render(w, http.StatusOK, "overview", p)
}

// notice turns the counts a change redirects with into a sentence. Only
// numbers travel in the address, so nobody can make the page say
// anything else.
func notice(q url.Values) string {
	for _, a := range []action{actionRequeue, actionDiscard} {
		if v := q.Get(a.done); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return ""
			}
			return fmt.Sprintf("%s %d dead letter%s.", a.past, n, plural(n))
		}
	}
	return ""
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// listData is the data of the dead-letter list page.
type listData struct {
	Error   string
	Letters []sqladapters.DeadLetter
	// Next is the id to continue after, 0 on the last page.
	Next  int64
	After int64
}

func (h *handler) deadList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if !q.Has("error") {
		h.fail(w, r, http.StatusBadRequest, "Which error group?", "The address names no error group.")
		return
	}
	d := listData{Error: q.Get("error")}
	if v := q.Get("after"); v != "" {
		after, err := strconv.ParseInt(v, 10, 64)
		if err != nil || after < 0 {
			h.fail(w, r, http.StatusBadRequest, "Bad address", "after must be a message id.")
			return
		}
		d.After = after
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	var err error
	d.Letters, d.Next, err = h.store.letters(ctx, d.Error, d.After, h.cfg.PageSize)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	h.render(w, http.StatusOK, "list", h.newPage(w, r, d))
}

// letterData is the data of the page of one dead letter.
type letterData struct {
	Letter   sqladapters.DeadLetter
	Metadata []metaPair
	// MetadataRaw is shown when the metadata is not a JSON object.
	MetadataRaw string
	Payload     payloadView
}

func (h *handler) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		h.notFound(w, r)
		return
	}
	ctx, cancel := h.ctx(r)
	defer cancel()
	l, found, err := h.store.letter(ctx, id)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	if !found {
		h.fail(w, r, http.StatusNotFound, "No such dead letter",
			fmt.Sprintf("Message %d is not a dead letter: it was requeued, published or discarded.", id))
		return
	}
	d := letterData{Letter: l, Payload: viewPayload(l.Payload, h.cfg.MaxPayloadBytes)}
	d.Metadata, d.MetadataRaw = viewMetadata(l.Metadata)
	h.render(w, http.StatusOK, "letter", h.newPage(w, r, d))
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
// cross-origin browsers; here the request must be authorized and carry the
// token of a form this handler rendered.
func (h *handler) change(a action) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.allowed(r) {
			h.cfg.Logger.Warn("millbox admin: refused an unauthorized change", "action", a.name)
			h.fail(w, r, http.StatusForbidden, "Not allowed",
				"This page is read-only for you: changes need the permission the application grants.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, http.StatusBadRequest, "Bad form", err.Error())
			return
		}
		if !validToken(r, r.PostForm.Get(tokenField)) {
			h.cfg.Logger.Warn("millbox admin: refused a change without a valid form token", "action", a.name)
			h.fail(w, r, http.StatusForbidden, "Form expired",
				"The form did not carry this browser's token. Reload the page and try again.")
			return
		}
		sel, err := parseSelection(r.PostForm)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, "Bad form", err.Error())
			return
		}
		if a.confirm && r.PostForm.Get("confirm") != "yes" {
			h.fail(w, r, http.StatusBadRequest, "Not confirmed",
				"Tick the confirmation box to "+a.name+": discarded messages cannot be recovered.")
			return
		}
		ctx, cancel := h.ctx(r)
		defer cancel()
		var n int64
		switch a {
		case actionRequeue:
			n, err = h.store.requeue(ctx, sel)
		case actionDiscard:
			n, err = h.store.discard(ctx, sel)
		}
		if err != nil {
			h.dbError(w, r, err)
			return
		}
		if sel.ByError {
			h.cfg.Logger.Info("millbox admin: "+a.name, "error_group", shorten(200, sel.Error), "rows", n)
		} else {
			h.cfg.Logger.Info("millbox admin: "+a.name, "id", sel.ID, "rows", n)
		}
		// A relative Location: http.Redirect would resolve it against the
		// path StripPrefix left, which lacks the prefix.
		w.Header().Set("Location", "./?"+a.done+"="+strconv.FormatInt(n, 10))
		w.WriteHeader(http.StatusSeeOther)
	}
}

// selection is what a change applies to: one dead letter, or every dead
// letter whose last error is exactly Error.
type selection struct {
	ID      int64
	ByError bool
	Error   string
}

func parseSelection(f url.Values) (selection, error) {
	switch {
	case f.Has("id") && f.Has("error"):
		return selection{}, errors.New("give either id or error, not both")
	case f.Has("id"):
		id, err := strconv.ParseInt(f.Get("id"), 10, 64)
		if err != nil || id <= 0 {
			return selection{}, errors.New("id must be a message id")
		}
		return selection{ID: id}, nil
	case f.Has("error"):
		return selection{ByError: true, Error: f.Get("error")}, nil
	}
	return selection{}, errors.New("the form names no message (id) and no error group (error)")
}
