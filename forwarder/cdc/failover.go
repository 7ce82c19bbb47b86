package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/sqladapters"
)

// This file tells a slot that was lost or replaced from one the reader
// left: a primary that died and a standby promoted in its place (which,
// before PostgreSQL 17, has no slot), a slot dropped or created again.
// Rows of the outbox table lose nothing to it: a new session reads every
// pending row from the table. Messages of publishers without a table that
// the lost slot had not confirmed were in no table: they are lost, and the
// source says which stretch of the WAL held them.

// ErrSlotLost is matched by a SlotLostError (errors.Is).
var ErrSlotLost = errors.New("millbox cdc: replication slot lost")

// SlotLostError reports that the slot this forwarder read was lost and
// that the slot it reads now starts further on in the WAL: the slot was
// dropped, or the server is a standby promoted since (PostgreSQL before
// 17 keeps a slot on its server only). Rows of the outbox table between
// the two positions are read from the table; messages of publishers
// without a table committed between them (forwarder.PublisherConfig.
// WithoutTable) were only in the WAL, which the new slot cannot read: they
// are lost. The forwarder logs it as an error and passes it to
// forwarder.Hooks.OnError, and the last error of forwarder.Status holds
// it.
type SlotLostError struct {
	// Slot is the slot's name.
	Slot string
	// From is the position up to which this forwarder had confirmed the
	// lost slot; To is where the slot it reads now starts. Messages of
	// publishers without a table committed in between are lost.
	From, To uint64
	// PreviousTimeline is the server's timeline when this forwarder read
	// the lost slot, Timeline the one now: they differ after a promotion.
	PreviousTimeline, Timeline int32
}

// Bytes is the length of the WAL the new slot cannot read.
func (e *SlotLostError) Bytes() uint64 {
	if e.To <= e.From {
		return 0
	}
	return e.To - e.From
}

// Error says which slot was lost, why, and what of the WAL is lost with it.
func (e *SlotLostError) Error() string {
	why := "it was dropped"
	if e.Timeline != e.PreviousTimeline {
		why = fmt.Sprintf("the server was promoted (timeline %d, was %d), and the slot did not survive", e.Timeline, e.PreviousTimeline)
	}
	return fmt.Sprintf("millbox cdc: replication slot %s was lost (%s); the slot read now starts at %v, this forwarder had confirmed the lost one up to %v: "+
		"messages of publishers without a table committed between %v and %v (%d bytes of WAL) cannot be read and are lost; rows of the outbox table are read from the table",
		e.Slot, why, pglogrepl.LSN(e.To), pglogrepl.LSN(e.From), pglogrepl.LSN(e.From), pglogrepl.LSN(e.To), e.Bytes())
}

// Is makes errors.Is(err, ErrSlotLost) hold.
func (e *SlotLostError) Is(target error) bool { return target == ErrSlotLost }

// Gap says what the forwarder could not read, for forwarder.Status.Gap.
func (e *SlotLostError) Gap() string { return e.Error() }

// serverMark is what this instance knew of the server and the slot when
// its last session ended.
type serverMark struct {
	known    bool
	systemID string
	timeline int32
}

// recreate creates the missing slot (and publication) with
// CreateIfMissing, at any time: a standby promoted in place of a primary
// that died has neither the slot nor, before PostgreSQL 17, any copy of
// it. The new session reads what the lost slot had not confirmed from
// the table.
func (s *streamer) recreate(ctx context.Context) error {
	if !s.cfg.CreateIfMissing {
		hint := ""
		if s.hist.known {
			hint = fmt.Sprintf(" any more (this forwarder read it up to %v: it was dropped, or the server is a standby promoted since)", pglogrepl.LSN(s.confirmed.Load()))
		}
		return fmt.Errorf("%w: slot %s does not exist%s; create it with cdc.Setup, or set cdc.Source.CreateIfMissing to have the forwarder create it",
			ErrNotSetUp, s.cfg.Slot, hint)
	}
	st, err := s.lg.Check(ctx, s.env.DB, s.cfg.Publication, s.cfg.Slot)
	if err != nil {
		return fmt.Errorf("millbox cdc: check the database: %w", err)
	}
	if err := checkStatus(ctx, s.env, s.lg, s.cfg, st); err != nil {
		return err
	}
	s.env.Logger.Info("millbox cdc: the replication slot was missing; created it", watermill.LogFields{"slot": s.cfg.Slot})
	return nil
}

// noteServer compares the server and the slot a new session reads with
// those of this instance's last session, and reports a slot lost or
// replaced: loudly, since messages of publishers without a table may be
// lost with it.
func (s *streamer) noteServer(sys pglogrepl.IdentifySystemResult, slot sqladapters.SlotState, created bool) {
	prev := s.hist
	s.hist = serverMark{known: true, systemID: sys.SystemID, timeline: sys.Timeline}
	fields := watermill.LogFields{"slot": s.cfg.Slot, "timeline": sys.Timeline}
	if !prev.known {
		if created && sys.Timeline > 1 {
			s.env.Logger.Info("millbox cdc: warning: created the replication slot on a server that was promoted at some time (its timeline is above 1): "+
				"if a forwarder read this slot on the previous primary, messages of publishers without a table it had not confirmed are lost; "+
				"rows of the outbox table are read from the table", fields)
		}
		return
	}
	from := s.confirmed.Load()
	promoted := sys.Timeline != prev.timeline || sys.SystemID != prev.systemID
	switch {
	case created || (promoted && slot.Confirmed > from):
		err := &SlotLostError{Slot: s.cfg.Slot, From: from, To: max(slot.Confirmed, from), PreviousTimeline: prev.timeline, Timeline: sys.Timeline}
		s.env.ReportError(err)
		s.env.Logger.Error("millbox cdc: replication slot lost", err, watermill.LogFields{
			"slot": s.cfg.Slot, "lost_from": pglogrepl.LSN(err.From).String(), "lost_to": pglogrepl.LSN(err.To).String(), "lost_bytes": err.Bytes(),
			"timeline": sys.Timeline, "previous_timeline": prev.timeline,
		})
	case promoted:
		// A failover slot a standby kept: it may lag what this instance
		// confirmed on the old primary, and what follows it is read again.
		s.env.Logger.Info("millbox cdc: the server was promoted; its copy of the replication slot is read, from its own position "+
			"(messages after it are delivered again)", watermill.LogFields{
			"slot": s.cfg.Slot, "slot_confirmed": pglogrepl.LSN(slot.Confirmed).String(), "confirmed_before": pglogrepl.LSN(from).String(),
			"timeline": sys.Timeline, "previous_timeline": prev.timeline,
		})
	}
}
