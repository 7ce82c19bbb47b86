package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// store is the page's view of sqladapters/ops: it reads and changes the
// installation and shapes the results for the templates.
type store struct {
	ops  *ops.Ops
	name string
}

func newStore(cfg Config) (*store, error) {
	o, err := ops.New(cfg.DB, cfg.Dialect)
	if err != nil {
		return nil, fmt.Errorf("%w: admin.Config.Dialect: %w", ErrInvalidConfig, err)
	}
	return &store{ops: o, name: cfg.Dialect.Name()}, nil
}

func (s *store) dialectName() string { return s.name }

// status is the state the overview shows.
type status struct {
	ops.Status
	// Total sums Topics.
	Total ops.TopicStatus
}

func (s *store) status(ctx context.Context) (status, error) {
	st, err := s.ops.Status(ctx)
	if err != nil {
		return status{}, err
	}
	return status{Status: st, Total: ops.TopicStatus{
		Topic:            "all",
		Pending:          st.Pending,
		Retrying:         st.Retrying,
		OldestPendingAge: st.OldestPendingAge,
		DeadLetters:      st.DeadLetters,
		ForwardedKept:    st.ForwardedKept,
	}}, nil
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

func (s *store) letters(ctx context.Context, errText string, after int64, limit int) ([]sqladapters.DeadLetter, int64, error) {
	return s.ops.ListErrorGroup(ctx, errText, after, limit)
}

func (s *store) letter(ctx context.Context, id int64) (sqladapters.DeadLetter, bool, error) {
	dl, err := s.ops.ShowDeadLetter(ctx, id)
	if errors.Is(err, ops.ErrNotFound) {
		return dl, false, nil
	}
	return dl, err == nil, err
}

func (s *store) requeue(ctx context.Context, sel selection) (int64, error) {
	if sel.ByError {
		return s.ops.RequeueErrorGroup(ctx, sel.Error, ops.ChangeOptions{})
	}
	return s.ops.Requeue(ctx, ops.Filter{IDs: []int64{sel.ID}}, ops.ChangeOptions{})
}

func (s *store) discard(ctx context.Context, sel selection) (int64, error) {
	if sel.ByError {
		return s.ops.DiscardErrorGroup(ctx, sel.Error, ops.ChangeOptions{})
	}
	return s.ops.Discard(ctx, ops.Filter{IDs: []int64{sel.ID}}, ops.ChangeOptions{})
}
