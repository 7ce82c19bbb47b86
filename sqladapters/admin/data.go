package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// listErrorChars is how much of each error a list page reads.
const listErrorChars = 2000

// store is the page's view of sqladapters/ops: it reads and changes the
// installation and shapes the results for the templates.
type store struct {
	ops *ops.Ops
	d   sqladapters.Dialect
	db  sqladapters.Executor

	mu    sync.Mutex // guards where
	where *where
}

func newStore(cfg Config) (*store, error) {
	o, err := ops.New(cfg.DB, cfg.Dialect)
	if err != nil {
		return nil, fmt.Errorf("%w: admin.Config: %w", ErrInvalidConfig, err)
	}
	return &store{ops: o, d: cfg.Dialect, db: cfg.DB}, nil
}

// where names the installation in the page's header.
type where struct {
	Database string
	// Schema is the schema or database holding the tables, "" until it
	// was read.
	Schema        string
	Outbox, Inbox string
}

// location returns the header's names; the schema is read from the
// database until one read succeeded, when the dialect does not name it.
func (s *store) location(ctx context.Context) where {
	w := s.cached()
	if w.Schema != "" {
		return w
	}
	if schema, err := s.d.CurrentSchema(ctx, s.db); err == nil && schema != "" {
		w.Schema = schema
		s.mu.Lock()
		s.where = &w
		s.mu.Unlock()
	}
	return w
}

// cached returns the header's names without asking the database.
func (s *store) cached() where {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.where != nil {
		return *s.where
	}
	return where{Database: s.d.Name(), Outbox: tableName(s.d.OutboxTable()), Inbox: tableName(s.d.InboxTable())}
}

// tableName is the last part of a quoted, qualified name: millbox_outbox
// of "app"."millbox_outbox".
func tableName(quoted string) string {
	name := quoted[strings.LastIndexAny(quoted, ".")+1:]
	return strings.Trim(name, "\"`")
}

// status is the state the overview shows.
type status struct {
	ops.Status
	// Total sums Topics.
	Total sqladapters.TopicStats
	// Warnings are what needs an operator, with ids for the page.
	Warnings []warning
	// PendingWarn and DeadWarn mark the numbers the warnings are about.
	PendingWarn, DeadWarn bool
}

// warning is one thing the overview warns about.
type warning struct {
	ID, Text string
}

func (s *store) status(ctx context.Context, w Warnings) (status, error) {
	st, err := s.ops.Status(ctx)
	if err != nil {
		return status{}, err
	}
	out := status{Status: st, Total: sqladapters.TopicStats{
		Topic:         "all",
		OutboxStats:   st.OutboxStats,
		Retrying:      st.Retrying,
		ForwardedKept: st.ForwardedKept,
	}}
	if w.PendingAge >= 0 && st.Pending > 0 && st.OldestPendingAge > w.PendingAge {
		out.PendingWarn = true
		out.Warnings = append(out.Warnings, warning{"warn-pending", fmt.Sprintf(
			"The oldest pending message has waited %s, longer than %s: check that forwarders run and that the destination accepts messages.",
			formatAge(st.OldestPendingAge), formatAge(w.PendingAge))})
	}
	if w.DeadLetters >= 0 && st.Dead > w.DeadLetters {
		out.DeadWarn = true
		out.Warnings = append(out.Warnings, warning{"warn-dead", fmt.Sprintf(
			"%d dead letter%s wait for an operator: requeue them once their cause is fixed, or discard them.", st.Dead, plural(st.Dead))})
	}
	if st.HeldKeys > 0 {
		out.Warnings = append(out.Warnings, warning{"warn-held", fmt.Sprintf(
			"%d ordering key%s held by dead letters: their later messages wait until the dead letter is requeued (it goes first, then they follow in order) or discarded.",
			st.HeldKeys, map[bool]string{true: " is", false: "s are"}[st.HeldKeys == 1])})
	}
	if !w.IgnoreLeases && len(st.Owners) == 0 {
		out.Warnings = append(out.Warnings, warning{"warn-no-forwarder",
			"No forwarder holds a partition: none is running, so nothing is forwarded."})
	}
	return out, nil
}

// groups returns the largest limit error groups and whether there are
// more.
func (s *store) groups(ctx context.Context, limit int) ([]ops.ErrorGroup, bool, error) {
	gs, err := s.ops.GroupDeadLetters(ctx, ops.Filter{}, limit+1)
	if err != nil {
		return nil, false, err
	}
	if len(gs) > limit {
		return gs[:limit], true, nil
	}
	return gs, false, nil
}

// held returns the first limit keys held by dead letters and whether
// there are more.
func (s *store) held(ctx context.Context, limit int) ([]ops.HeldKey, bool, error) {
	ks, err := s.ops.HeldKeys(ctx, limit+1)
	if err != nil {
		return nil, false, err
	}
	if len(ks) > limit {
		return ks[:limit], true, nil
	}
	return ks, false, nil
}

// letters returns a page of the dead letters f selects, without payloads
// and with the start of their errors, and the id to continue after, 0
// when there are no more.
func (s *store) letters(ctx context.Context, f ops.Filter, after int64, limit int) ([]sqladapters.DeadLetter, int64, error) {
	dls, err := s.ops.ListDeadLetters(ctx, ops.ListQuery{Filter: f, AfterID: after, Limit: limit + 1, ErrorChars: listErrorChars})
	if err != nil || len(dls) <= limit {
		return dls, 0, err
	}
	return dls[:limit], dls[limit-1].ID, nil
}

func (s *store) letter(ctx context.Context, id int64) (sqladapters.DeadLetter, bool, error) {
	dl, err := s.ops.ShowDeadLetter(ctx, id)
	if errors.Is(err, ops.ErrNotFound) {
		return dl, false, nil
	}
	return dl, err == nil, err
}

// selected is the filter of a change: one dead letter, or one error
// group.
func selected(p params) ops.Filter {
	if p.group != nil {
		return ops.Filter{Fingerprint: p.group}
	}
	return ops.Filter{IDs: []int64{p.id}}
}

func (s *store) requeue(ctx context.Context, p params) (int64, error) {
	return s.ops.Requeue(ctx, selected(p), ops.ChangeOptions{})
}

func (s *store) discard(ctx context.Context, p params) (int64, error) {
	return s.ops.Discard(ctx, selected(p), ops.ChangeOptions{})
}
