package forwarder

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// DefaultHealthTimeout bounds one Status call of the readiness check.
const DefaultHealthTimeout = 5 * time.Second

// Status is the state of a forwarder instance and of its outbox.
type Status struct {
	// Running is true between the start of Run and its end.
	Running bool
	// Partitions lists the partitions this instance holds leases on,
	// ascending.
	Partitions []int
	// LastPublish is when the destination last acknowledged a message
	// sent by this instance; zero before the first.
	LastPublish time.Time
	// LastError is the last error of a publish call, "" before the first;
	// LastErrorAt is when it happened.
	LastError   string
	LastErrorAt time.Time
	// DatabaseDownSince is when the forwarder's reads of the outbox's
	// database started to fail (it is down, or read-only: a failover),
	// zero while they succeed.
	DatabaseDownSince time.Time
	// Gap is the last stretch of the outbox's history this forwarder
	// could not read, and GapAt when it found it; "" while none: with
	// cdc.Source, a replication slot lost in a failover
	// (cdc.SlotLostError), where messages of publishers without a table
	// are lost. It stays until the forwarder restarts.
	Gap   string
	GapAt time.Time
	// OutboxStats is the outbox's backlog, every instance's: pending
	// messages and the age of the oldest, dead letters (in the outbox's
	// table of dead letters) and the keys they hold, scheduled messages
	// and the earliest due time.
	sqladapters.OutboxStats
}

// StatusSource reports the Status that HealthHandler judges.
type StatusSource interface {
	Status(ctx context.Context) (Status, error)
}

// HealthOptions configures HealthHandler.
type HealthOptions struct {
	// MaxPendingAge makes the readiness check fail while the oldest
	// pending message is older. Defaults to 0: no limit.
	MaxPendingAge time.Duration
	// Timeout bounds each Status call. Defaults to DefaultHealthTimeout.
	Timeout time.Duration
}

// HealthHandler serves a liveness and a readiness check, chosen by the last
// element of the request path:
//
//   - /healthz (or /livez) answers 200 as long as the process serves HTTP.
//     It does not ask the database: a liveness check that fails with the
//     database would restart every instance during a database outage.
//   - /readyz answers 200 when source reports a running forwarder whose
//     database answers (Status.DatabaseDownSince is zero) and whose
//     outbox has no pending message older than MaxPendingAge, and 503
//     otherwise, or when Status fails. A gap in what the forwarder could
//     read (Status.Gap) shows in the body without failing the check.
//
// Other paths answer 404. Both bodies are JSON: "status" is "ok", "ready"
// or "not_ready", "reasons" says why an instance is not ready, and the
// readiness body carries the Status. Mount it on both paths, or on a
// prefix: mux.Handle("/healthz", h); mux.Handle("/readyz", h).
//
// The age limit is the outbox's, so every instance of one outbox turns not
// ready at once: alert on it rather than restart on it.
func HealthHandler(source StatusSource, opts HealthOptions) http.Handler {
	opts.Timeout = cmp.Or(opts.Timeout, DefaultHealthTimeout)
	return &healthHandler{source: source, opts: opts}
}

type healthHandler struct {
	source StatusSource
	opts   HealthOptions
}

// healthBody is the JSON answer of both checks.
type healthBody struct {
	Status  string        `json:"status"`
	Reasons []string      `json:"reasons,omitempty"`
	Detail  *statusDetail `json:"forwarder,omitempty"`
}

// statusDetail is Status in JSON, with durations in seconds.
type statusDetail struct {
	Running                 bool       `json:"running"`
	Partitions              []int      `json:"partitions"`
	LastPublish             *time.Time `json:"last_publish,omitempty"`
	LastError               string     `json:"last_error,omitempty"`
	LastErrorAt             *time.Time `json:"last_error_at,omitempty"`
	Pending                 int64      `json:"pending"`
	Dead                    int64      `json:"dead"`
	HeldKeys                int64      `json:"held_keys,omitempty"`
	Scheduled               int64      `json:"scheduled"`
	OldestPendingAgeSeconds *float64   `json:"oldest_pending_age_seconds,omitempty"`
	NextDue                 *time.Time `json:"next_due,omitempty"`
	DatabaseDownSince       *time.Time `json:"database_down_since,omitempty"`
	Gap                     string     `json:"gap,omitempty"`
	GapAt                   *time.Time `json:"gap_at,omitempty"`
}

func newStatusDetail(s Status) *statusDetail {
	d := &statusDetail{
		Running:    s.Running,
		Partitions: s.Partitions,
		LastError:  s.LastError,
		Pending:    s.Pending,
		Dead:       s.Dead,
		HeldKeys:   s.HeldKeys,
		Scheduled:  s.Scheduled,
	}
	if d.Partitions == nil {
		d.Partitions = []int{}
	}
	if !s.LastPublish.IsZero() {
		d.LastPublish = &s.LastPublish
	}
	if !s.LastErrorAt.IsZero() {
		d.LastErrorAt = &s.LastErrorAt
	}
	if !s.NextDue.IsZero() {
		d.NextDue = &s.NextDue
	}
	if !s.DatabaseDownSince.IsZero() {
		d.DatabaseDownSince = &s.DatabaseDownSince
	}
	if s.Gap != "" {
		d.Gap, d.GapAt = s.Gap, &s.GapAt
	}
	if s.OldestPendingAge >= 0 {
		age := s.OldestPendingAge.Seconds()
		d.OldestPendingAgeSeconds = &age
	}
	return d
}

func (h *healthHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeHealth(w, http.StatusMethodNotAllowed, healthBody{Status: "error", Reasons: []string{"method not allowed"}})
		return
	}
	switch path.Base(r.URL.Path) {
	case "healthz", "livez":
		writeHealth(w, http.StatusOK, healthBody{Status: "ok"})
	case "readyz":
		h.ready(w, r)
	default:
		writeHealth(w, http.StatusNotFound, healthBody{Status: "error", Reasons: []string{"unknown check; use /healthz or /readyz"}})
	}
}

func (h *healthHandler) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.opts.Timeout)
	defer cancel()
	s, err := h.source.Status(ctx)
	if err != nil {
		writeHealth(w, http.StatusServiceUnavailable, healthBody{
			Status:  "not_ready",
			Reasons: []string{"cannot read the forwarder's status: " + err.Error()},
		})
		return
	}
	body := healthBody{Status: "ready", Detail: newStatusDetail(s)}
	if !s.Running {
		body.Reasons = append(body.Reasons, "the forwarder is not running")
	}
	if !s.DatabaseDownSince.IsZero() {
		body.Reasons = append(body.Reasons, fmt.Sprintf("the outbox's database has failed since %s (down, or read-only after a failover)",
			s.DatabaseDownSince.UTC().Format(time.RFC3339)))
	}
	if h.opts.MaxPendingAge > 0 && s.OldestPendingAge > h.opts.MaxPendingAge {
		body.Reasons = append(body.Reasons, fmt.Sprintf("the oldest pending message is %v old, over the limit of %v",
			s.OldestPendingAge.Round(time.Second), h.opts.MaxPendingAge))
	}
	code := http.StatusOK
	if len(body.Reasons) > 0 {
		body.Status = "not_ready"
		code = http.StatusServiceUnavailable
	}
	writeHealth(w, code, body)
}

func writeHealth(w http.ResponseWriter, code int, body healthBody) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
