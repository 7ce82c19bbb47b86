package forwarder_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
)

// fakeStatus is a StatusSource whose answer the test sets.
type fakeStatus struct {
	mu     sync.Mutex
	status forwarder.Status
	err    error
	calls  int
}

func (f *fakeStatus) Status(context.Context) (forwarder.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return f.status, f.err
}

func (f *fakeStatus) set(s forwarder.Status, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status, f.err = s, err
}

type healthReply struct {
	code int
	body struct {
		Status    string   `json:"status"`
		Reasons   []string `json:"reasons"`
		Forwarder *struct {
			Running    bool     `json:"running"`
			Partitions []int    `json:"partitions"`
			Pending    int64    `json:"pending"`
			Age        *float64 `json:"oldest_pending_age_seconds"`
			LastError  string   `json:"last_error"`
		} `json:"forwarder"`
	}
	raw string
}

func get(t *testing.T, h http.Handler, path string) healthReply {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	var r healthReply
	r.code, r.raw = rec.Code, rec.Body.String()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s: content type %q", path, ct)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &r.body); err != nil {
		t.Fatalf("%s: body %q: %v", path, rec.Body.String(), err)
	}
	return r
}

func TestReadinessFollowsRunningAndPendingAge(t *testing.T) {
	src := &fakeStatus{}
	h := forwarder.HealthHandler(src, forwarder.HealthOptions{MaxPendingAge: time.Minute})

	src.set(forwarder.Status{Running: true, Partitions: []int{0, 2}, OutboxStats: sqladapters.OutboxStats{Pending: 3, OldestPendingAge: 2 * time.Second}}, nil)
	r := get(t, h, "/readyz")
	if r.code != http.StatusOK || r.body.Status != "ready" || len(r.body.Reasons) != 0 {
		t.Fatalf("running forwarder: %d %+v", r.code, r.body)
	}
	if f := r.body.Forwarder; f == nil || !f.Running || len(f.Partitions) != 2 || f.Pending != 3 || f.Age == nil || *f.Age != 2 {
		t.Fatalf("status detail: %+v", r.body.Forwarder)
	}

	src.set(forwarder.Status{Running: false, LastError: "broker down"}, nil)
	r = get(t, h, "/readyz")
	if r.code != http.StatusServiceUnavailable || r.body.Status != "not_ready" ||
		len(r.body.Reasons) != 1 || !strings.Contains(r.body.Reasons[0], "not running") {
		t.Fatalf("stopped forwarder: %d %+v", r.code, r.body)
	}
	if r.body.Forwarder.LastError != "broker down" || r.body.Forwarder.Partitions == nil {
		t.Fatalf("status detail: %+v", r.body.Forwarder)
	}

	src.set(forwarder.Status{Running: true, OutboxStats: sqladapters.OutboxStats{Pending: 10, OldestPendingAge: 90 * time.Second}}, nil)
	r = get(t, h, "/readyz")
	if r.code != http.StatusServiceUnavailable || len(r.body.Reasons) != 1 || !strings.Contains(r.body.Reasons[0], "1m30s old, over the limit of 1m0s") {
		t.Fatalf("old backlog: %d %+v", r.code, r.body)
	}

	src.set(forwarder.Status{Running: true}, nil)
	if r = get(t, h, "/readyz"); r.code != http.StatusOK {
		t.Fatalf("drained: %d %+v", r.code, r.body)
	}

	// A failover: the database fails, then answers again with a gap the
	// forwarder could not read.
	since := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	src.set(forwarder.Status{Running: true, DatabaseDownSince: since}, nil)
	if r = get(t, h, "/readyz"); r.code != http.StatusServiceUnavailable || len(r.body.Reasons) != 1 ||
		!strings.Contains(r.body.Reasons[0], "failed since 2026-01-02T03:04:05Z") {
		t.Fatalf("database down: %d %+v", r.code, r.body)
	}
	src.set(forwarder.Status{Running: true, Gap: "replication slot s was lost", GapAt: since}, nil)
	if r = get(t, h, "/readyz"); r.code != http.StatusOK || !strings.Contains(r.raw, `"gap":"replication slot s was lost"`) {
		t.Fatalf("gap: %d %+v %s", r.code, r.body, r.raw)
	}

	src.set(forwarder.Status{}, errors.New("connection refused"))
	r = get(t, h, "/readyz")
	if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body.Reasons[0], "connection refused") {
		t.Fatalf("status error: %d %+v", r.code, r.body)
	}
}

func TestLivenessDoesNotAskForStatus(t *testing.T) {
	src := &fakeStatus{err: errors.New("database down")}
	h := forwarder.HealthHandler(src, forwarder.HealthOptions{})
	for _, p := range []string{"/healthz", "/livez", "/ops/healthz"} {
		if r := get(t, h, p); r.code != http.StatusOK || r.body.Status != "ok" {
			t.Fatalf("%s: %d %+v", p, r.code, r.body)
		}
	}
	if src.calls != 0 {
		t.Fatalf("liveness called Status %d times", src.calls)
	}
	if r := get(t, h, "/metrics"); r.code != http.StatusNotFound {
		t.Fatalf("unknown path: %d", r.code)
	}
}

func TestReadinessWithoutAgeLimitIgnoresAge(t *testing.T) {
	src := &fakeStatus{status: forwarder.Status{Running: true, OutboxStats: sqladapters.OutboxStats{OldestPendingAge: 24 * time.Hour}}}
	h := forwarder.HealthHandler(src, forwarder.HealthOptions{})
	if r := get(t, h, "/readyz"); r.code != http.StatusOK {
		t.Fatalf("%d %+v", r.code, r.body)
	}
}

// staticStatus is a StatusSource with a fixed answer.
type staticStatus forwarder.Status

func (s staticStatus) Status(context.Context) (forwarder.Status, error) {
	return forwarder.Status(s), nil
}

func ExampleHealthHandler() {
	// A forwarder whose oldest pending message waits for longer than the
	// limit: alive, but not ready.
	source := staticStatus{Running: true, Partitions: []int{0, 1}, OutboxStats: sqladapters.OutboxStats{Pending: 42, OldestPendingAge: 10 * time.Minute}}
	health := forwarder.HealthHandler(source, forwarder.HealthOptions{MaxPendingAge: 5 * time.Minute})
	mux := http.NewServeMux()
	mux.Handle("/healthz", health)
	mux.Handle("/readyz", health)

	for _, path := range []string{"/healthz", "/readyz"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 200 {"status":"ok"}
	// 503 {"status":"not_ready","reasons":["the oldest pending message is 10m0s old, over the limit of 5m0s"],"forwarder":{"running":true,"partitions":[0,1],"pending":42,"dead":0,"scheduled":0,"oldest_pending_age_seconds":600}}
}
