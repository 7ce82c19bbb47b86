package cdc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
)

// Defaults of Source.
const (
	DefaultSlot           = "millbox_cdc"
	DefaultPublication    = "millbox_cdc"
	DefaultStandbyRetry   = time.Second
	DefaultStatusInterval = time.Second
	DefaultPollInterval   = time.Second
)

var (
	// ErrWalLevel is returned by Run when the server's wal_level is not
	// logical. The error says how to change it.
	ErrWalLevel = errors.New("millbox cdc: wal_level is not logical")
	// ErrNoReplicationRole is returned by Run when the role of
	// Source.ConnString lacks the REPLICATION attribute. The error says how
	// to grant it.
	ErrNoReplicationRole = errors.New("millbox cdc: role lacks REPLICATION")
	// ErrNotSetUp is returned by Run when the publication or the slot does
	// not exist and Source.CreateIfMissing is false.
	ErrNotSetUp = errors.New("millbox cdc: publication or replication slot missing")
	// ErrInvalidConfig is sqladapters.ErrInvalidConfig, returned for a bad
	// Source; the error names the field and the rule.
	ErrInvalidConfig = sqladapters.ErrInvalidConfig
)

// slotNameRe is PostgreSQL's rule for replication slot names.
var slotNameRe = regexp.MustCompile(`^[a-z0-9_]+$`)

// Source is the change-data-capture source of a forwarder: set it as
// forwarder.Config.Source. Instead of reading the outbox table, the
// forwarder streams the table's inserts from a publication through a
// logical replication slot (plugin pgoutput). Pass it by value; zero
// fields take their defaults.
type Source struct {
	// ConnString is the PostgreSQL connection string (URL or key=value)
	// of the database holding the outbox. The forwarder opens its
	// replication connection with it (adding replication=database), so
	// its role needs the REPLICATION attribute. Required.
	ConnString string
	// Slot is the logical replication slot the forwarder reads. Slot names
	// are global to the PostgreSQL cluster: give every outbox its own.
	// Defaults to DefaultSlot.
	Slot string
	// Publication is the publication of the outbox table the slot
	// decodes. Defaults to DefaultPublication.
	Publication string
	// CreateIfMissing makes Run create the publication and the slot (as
	// Setup does) when they do not exist: at start, and whenever the
	// reader finds the slot gone later (dropped, or the server is a
	// standby promoted since; see Failover in the package doc), after
	// which it reads from the table what the lost slot had not confirmed.
	// Defaults to false: Run reports them missing, and so does the reader.
	CreateIfMissing bool
	// StandbyRetry is how often a standby instance tries to become the
	// active reader. Defaults to DefaultStandbyRetry.
	StandbyRetry time.Duration
	// StatusInterval is how often the confirmed position is reported to
	// the server. Defaults to DefaultStatusInterval.
	StatusInterval time.Duration
	// PollInterval is how often the rows of keys handed to the table
	// (keys with a failed attempt or a dead letter that holds them) are
	// read while such keys exist; the stream brings every other row.
	// Defaults to DefaultPollInterval.
	PollInterval time.Duration
}

func (s *Source) setDefaults() {
	s.Slot = cmp.Or(s.Slot, DefaultSlot)
	s.Publication = cmp.Or(s.Publication, DefaultPublication)
	s.StandbyRetry = cmp.Or(s.StandbyRetry, DefaultStandbyRetry)
	s.StatusInterval = cmp.Or(s.StatusInterval, DefaultStatusInterval)
	s.PollInterval = cmp.Or(s.PollInterval, DefaultPollInterval)
}

// Validate names the first invalid field and the rule it breaks. Zero
// fields take their defaults first.
func (s Source) Validate() error {
	s.setDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if s.ConnString == "" {
		return bad("cdc.Source.ConnString is required (the replication connection)")
	}
	return s.validateNames()
}

// validateNames validates all but ConnString: what Setup needs.
func (s Source) validateNames() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if err := sqladapters.ValidateIdentifier("cdc.Source.Slot", s.Slot); err != nil {
		return bad("%v", err)
	}
	if err := sqladapters.ValidateIdentifier("cdc.Source.Publication", s.Publication); err != nil {
		return bad("%v", err)
	}
	switch {
	case !slotNameRe.MatchString(s.Slot):
		return bad("cdc.Source.Slot %q may contain only lower case letters, digits and underscores (PostgreSQL's rule for slot names)", s.Slot)
	case s.StandbyRetry < 10*time.Millisecond:
		return bad("cdc.Source.StandbyRetry must be at least 10ms, got %v", s.StandbyRetry)
	case s.PollInterval < time.Millisecond:
		return bad("cdc.Source.PollInterval must be at least 1ms, got %v", s.PollInterval)
	case s.StatusInterval < 10*time.Millisecond || s.StatusInterval > 30*time.Second:
		return bad("cdc.Source.StatusInterval must be between 10ms and 30s (below the server's wal_sender_timeout), got %v", s.StatusInterval)
	}
	return nil
}

// logical returns the store of the change-data-capture statements of d.
func logical(d sqladapters.Dialect) (sqladapters.Logical, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: a dialect is required", ErrInvalidConfig)
	}
	lg := d.Logical()
	if lg == nil {
		return nil, fmt.Errorf("%w: the %s dialect cannot stream its changes: change data capture reads PostgreSQL's logical replication", ErrInvalidConfig, d.Name())
	}
	return lg, nil
}

// Open implements forwarder.Source.
func (s Source) Open(env source.Env) (source.Source, error) {
	s.setDefaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	lg, err := logical(env.Dialect)
	if err != nil {
		return nil, err
	}
	return &streamer{cfg: s, env: env, lg: lg, feed: make(chan func(), 64)}, nil
}

// Setup creates the publication of the outbox table's inserts
// and the logical replication slot (plugin pgoutput) that src names, on
// the database db, skipping what exists. The slot starts at the current
// end of the WAL: rows already in the table are published through the
// forwarder's polling path when it starts. On PostgreSQL 17 and later it
// is a failover slot, which standbys can keep (see Failover in the
// package doc). Run it once per outbox, from a
// role allowed to create publications (owner of the table) with
// REPLICATION; or set Source.CreateIfMissing.
//
// A slot keeps every WAL segment from its confirmed position on: drop it
// with Drop when no forwarder will read it again.
func Setup(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect, src Source) error {
	src.setDefaults()
	if err := src.validateNames(); err != nil {
		return err
	}
	lg, err := logical(d)
	if err != nil {
		return err
	}
	st, err := lg.Check(ctx, db, src.Publication, src.Slot)
	if err != nil {
		return fmt.Errorf("millbox cdc: check the database: %w", err)
	}
	return setup(ctx, db, lg, src, st)
}

// failoverSlots is the first server_version_num with failover slots.
const failoverSlots = 170000

// setup creates what st says is missing; the slot is a failover slot
// where the server has them.
func setup(ctx context.Context, db sqladapters.Executor, lg sqladapters.Logical, src Source, st sqladapters.LogicalStatus) error {
	if !st.Publication {
		if err := lg.CreatePublication(ctx, db, src.Publication); err != nil {
			return fmt.Errorf("millbox cdc: create publication %s: %w", src.Publication, err)
		}
	}
	if !st.Slot {
		if err := lg.CreateSlot(ctx, db, src.Slot, st.ServerVersion >= failoverSlots); err != nil {
			return fmt.Errorf("millbox cdc: create replication slot %s: %w", src.Slot, explain(err))
		}
	}
	return nil
}

// Drop drops the replication slot and the publication src names, where
// they exist. The slot must not be in use: stop every forwarder first.
func Drop(ctx context.Context, db sqladapters.Executor, d sqladapters.Dialect, src Source) error {
	src.setDefaults()
	if err := src.validateNames(); err != nil {
		return err
	}
	lg, err := logical(d)
	if err != nil {
		return err
	}
	if err := lg.Drop(ctx, db, src.Publication, src.Slot); err != nil {
		return fmt.Errorf("millbox cdc: %w", err)
	}
	return nil
}

// preflight checks what Run needs and says how to fix what is missing;
// it warns of a setting that puts messages at risk.
func preflight(ctx context.Context, env source.Env, lg sqladapters.Logical, src Source) (sqladapters.LogicalStatus, error) {
	st, err := lg.Check(ctx, env.DB, src.Publication, src.Slot)
	if err != nil {
		return st, fmt.Errorf("millbox cdc: check the database: %w", err)
	}
	if err := checkStatus(ctx, env, lg, src, st); err != nil {
		return st, err
	}
	failover := st.SlotFailover || (!st.Slot && st.ServerVersion >= failoverSlots)
	if st.Standbys > 0 && !failover {
		env.Logger.Info("millbox cdc: warning: the server streams to standbys, and the slot does not survive a promotion "+
			"(before PostgreSQL 17 a slot lives on its server only; from 17 on, only a failover slot, which standbys with sync_replication_slots keep, does): "+
			"on a failover, messages of publishers without a table that the slot had not confirmed are lost, and the forwarder reports their range. "+
			"Rows of the outbox table are not: the forwarder creates the slot again (cdc.Source.CreateIfMissing) and reads them from the table. "+
			"See Failover in the forwarder/cdc package doc",
			watermill.LogFields{"slot": src.Slot, "standbys": st.Standbys, "server_version_num": st.ServerVersion})
	}
	switch {
	case st.MaxSlotWALKeepSize < 0:
		env.Logger.Info("millbox cdc: warning: max_slot_wal_keep_size is unset, so the slot retains WAL without bound: "+
			"a forwarder that stops for long, or a slot left behind, can fill the disk and stop the database. "+
			"Set it (ALTER SYSTEM SET max_slot_wal_keep_size = '…GB'), and alert on "+MetricSlotLag+" well below it: "+
			"a slot that passes it is invalidated, and messages of publishers without a table that it still held are lost",
			watermill.LogFields{"slot": src.Slot})
	case st.ServerVersion < 140000:
		env.Logger.Info("millbox cdc: warning: PostgreSQL before 14 cannot stream the messages of publishers without a table; they refuse to publish here",
			watermill.LogFields{"slot": src.Slot, "server_version_num": st.ServerVersion})
	}
	return st, nil
}

// checkStatus says what to fix of what Check read.
func checkStatus(ctx context.Context, env source.Env, lg sqladapters.Logical, src Source, st sqladapters.LogicalStatus) error {
	switch {
	case st.WalLevel != "logical":
		return fmt.Errorf("%w (it is %q): run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL "+
			"(also make sure max_replication_slots and max_wal_senders are at least 1 more than in use)", ErrWalLevel, st.WalLevel)
	case !st.Replication:
		return fmt.Errorf("%w: role %q cannot start logical replication; run ALTER ROLE %q REPLICATION "+
			"(or connect cdc.Source.ConnString as a role that has it)", ErrNoReplicationRole, st.Role, st.Role)
	case st.TableOID == 0:
		return &sqladapters.MissingTableError{Dialect: env.Dialect.Name(), Err: fmt.Errorf("relation %s does not exist", env.Dialect.OutboxTable())}
	case (!st.Publication || !st.Slot) && !src.CreateIfMissing:
		return fmt.Errorf("%w: publication %s exists: %v, slot %s exists: %v; create them with cdc.Setup, or set cdc.Source.CreateIfMissing",
			ErrNotSetUp, src.Publication, st.Publication, src.Slot, st.Slot)
	case !st.Publication || !st.Slot:
		return setup(ctx, env.DB, lg, src, st)
	}
	return nil
}

type sqlStater interface{ SQLState() string }

func sqlState(err error) string {
	var se sqlStater
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// explain adds what to change to the errors of a missing setting or
// privilege.
func explain(err error) error {
	switch sqlState(err) {
	case "55000": // object_not_in_prerequisite_state: wal_level
		return fmt.Errorf("%w: %w: run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL", ErrWalLevel, err)
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w: %w: run ALTER ROLE <role> REPLICATION", ErrNoReplicationRole, err)
	}
	return err
}
