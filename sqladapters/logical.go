package sqladapters

import (
	"context"
	"errors"
	"time"
)

// Logical is the store contract of the change-data-capture source
// (forwarder/cdc): the statements it runs on the outbox, its publication
// and its replication slot through an ordinary connection. The
// replication protocol itself (the stream, the standby status) is the
// source's own. Dialect.Logical returns it where the database streams its
// changes (PostgreSQL), and nil elsewhere.
//
// Logical is implemented by millbox's database packages and may gain
// methods in any release: use it, do not implement it.
type Logical interface {
	// Check reads, in one statement, what the source needs: the server's
	// wal_level, whether the current role may start replication, whether
	// the outbox table, the publication and the slot exist.
	Check(ctx context.Context, e Executor, publication, slot string) (LogicalStatus, error)
	// CreatePublication creates the publication of the outbox table's
	// inserts (new rows and requeued dead letters), unless it exists (also
	// when a concurrent caller created it first).
	CreatePublication(ctx context.Context, e Executor, publication string) error
	// CreateSlot creates the logical replication slot (plugin pgoutput),
	// unless it exists. With failover (PostgreSQL 17 and later only) it is
	// a failover slot: standbys that synchronize slots
	// (sync_replication_slots) keep a copy of it, which a promoted standby
	// streams from.
	CreateSlot(ctx context.Context, e Executor, slot string, failover bool) error
	// Drop drops the slot and the publication, where they exist. The slot
	// must not be in use.
	Drop(ctx context.Context, e Executor, publication, slot string) error
	// Slot reads the slot's confirmed position, whether a connection is
	// streaming from it, and how many bytes of WAL it retains beyond its
	// confirmed position. ok is false when the slot does not exist.
	Slot(ctx context.Context, e Executor, slot string) (s SlotState, ok bool, err error)

	// PendingKeys returns the keys that have pending rows, and with holds
	// the keys held by dead letters (Failure.Hold), with the mark of the
	// statement's snapshot.
	PendingKeys(ctx context.Context, e Executor, holds bool) (StreamMark, []StreamKey, error)
	// ReadKeys returns up to limit pending rows of the given keys (and of
	// rows without a key, when unkeyed is set), in id order, those waiting
	// for a retry included, with the mark of the statement's snapshot. With
	// holds, the dead letters that hold the given keys come among them, in
	// id order, as rows with Holds set.
	ReadKeys(ctx context.Context, e Executor, keys []string, unkeyed bool, limit int, holds bool) (StreamMark, []KeyedRow, error)
	// Emit writes records of the outbox without a table in tx: each a
	// transactional logical decoding message (pg_logical_emit_message) of
	// prefix EmitPrefix followed by the outbox table's oid, which commits
	// or rolls back with tx and which the stream delivers in commit order.
	// The database appends to each record the ids of its messages, drawn
	// from the outbox's id sequence: one 8-byte big-endian integer per
	// message. It fails with ErrEmitUnavailable, writing nothing, where
	// the server could not deliver them: before PostgreSQL 14, without
	// wal_level logical, or, with ErrEmitNoSlot too, with no logical
	// replication slot ready to decode in the database. The slot is looked
	// for by the statement that writes each record, in tx: never from an
	// earlier check, which a failover to a standby without the slot would
	// have made stale. When it fails, nothing of records stays in tx
	// (several records are written under a savepoint), and tx stays usable
	// after ErrEmitNoSlot.
	Emit(ctx context.Context, tx Executor, records []EmitRecord) error
	// WriteMessages writes messages the outbox without a table carried
	// into the tables, under the ids they were emitted with, in one
	// transaction: into the outbox, pending or with a failed attempt;
	// into the dead letters when that attempt is the last; into the kept
	// rows when they were forwarded (forwarder.Config.KeepForwarded). A
	// message whose id is in the outbox or the dead letters already (a
	// stream read again after a crash) is left as it is there. It returns
	// the id of the transaction that wrote them as the replication stream
	// names transactions (32 bits).
	WriteMessages(ctx context.Context, e DB, ms []WrittenMessage) (xid uint32, err error)
	// CompleteStreamed is Dialect.CompleteForwarded for rows seen in the
	// replication stream, which may not be visible to other sessions yet:
	// it returns the ids it found and the oldest transaction still
	// running when it ran, so that a row not found whose transaction is
	// not older than that can be tried again.
	CompleteStreamed(ctx context.Context, e Executor, ids []int64, keep bool) (found []int64, xmin uint64, err error)
}

// EmitPrefix starts the prefix of the logical decoding messages of the
// outbox without a table; the outbox table's oid in decimal follows, so
// that a reader takes only its own outbox's messages, however the
// publisher named the table.
const EmitPrefix = "millbox:"

var (
	// ErrEmitUnavailable is returned by Logical.Emit where the server
	// could not deliver what it would write; the error says what is
	// missing.
	ErrEmitUnavailable = errors.New("millbox: the outbox without a table is not available on this server")
	// ErrEmitNoSlot is returned by Logical.Emit, with ErrEmitUnavailable,
	// where the database has no logical replication slot ready to decode
	// at that moment: none was created yet, or the server is a standby
	// promoted since the forwarder last read its slot (before PostgreSQL
	// 17, a slot lives on one server only). Nothing was written and the
	// transaction stays usable: the outbox Publisher writes the messages
	// into the outbox table instead.
	ErrEmitNoSlot = errors.New("millbox: no logical replication slot in the database")
)

// EmitCountSuffix ends the prefix of the logical decoding message that
// carries a call's number from the count of calls without a table, next
// to the call's records (prefix EmitPrefix and the outbox's oid).
const EmitCountSuffix = "_n"

// EmitRecord is one record of the outbox without a table for
// Logical.Emit: its encoded messages, and how many ids to append.
type EmitRecord struct {
	Content  []byte
	Messages int
	// Slot is the logical replication slot that must exist for the
	// record to be written; "" for any logical slot of the database.
	Slot string
}

// WrittenMessage is a message of the outbox without a table that
// Logical.WriteMessages writes into a table.
type WrittenMessage struct {
	OutboxMessage
	// ID is the id the message was emitted with.
	ID int64
	// Created is when it was written: its transaction's commit.
	Created time.Time
	// Failure is its failed attempt, nil for none; with Failure.Dead it
	// goes to the dead letters. Failure.ID is not used.
	Failure *Failure
	// Kept writes it into the kept rows: it was forwarded.
	Kept bool
}

// LogicalStatus is what Logical.Check reads.
type LogicalStatus struct {
	// WalLevel is the server's wal_level; logical decoding needs
	// "logical".
	WalLevel string
	// ServerVersion is server_version_num, such as 150004: the outbox
	// without a table needs 140000 or later.
	ServerVersion int
	// MaxSlotWALKeepSize is max_slot_wal_keep_size in megabytes, -1 when
	// unset (a slot retains WAL without bound).
	MaxSlotWALKeepSize int64
	// Role is the current role; Replication tells that it may start
	// replication (REPLICATION or superuser).
	Role        string
	Replication bool
	// TableOID identifies the outbox table in the stream; 0 when it does
	// not exist.
	TableOID uint32
	// Publication and Slot tell whether they exist.
	Publication, Slot bool
	// SlotFailover tells that the slot is a failover slot (PostgreSQL 17
	// and later), which standbys can keep a copy of.
	SlotFailover bool
	// Standbys is the number of physical standbys streaming from the
	// server: replication connections that read no logical slot.
	Standbys int
}

// SlotState is a replication slot as Logical.Slot reads it.
type SlotState struct {
	// Confirmed is the position up to which the slot's reader confirmed
	// the stream (an LSN).
	Confirmed uint64
	// Active tells that a connection streams from the slot.
	Active bool
	// Lag is how many bytes of WAL the slot retains beyond Confirmed.
	Lag int64
}

// StreamMark is where and when a statement saw the table: the WAL
// position and the oldest transaction still running in its snapshot.
type StreamMark struct {
	LSN  uint64
	XMin uint64
	// Emits is the last number drawn from the count of calls of
	// publishers without a table: 0 when none was, -1 when the count
	// does not exist (a schema before migration 9). A stream that has
	// decoded a call of that number (EmitCountSuffix) has every such call
	// that may have committed before the statement.
	Emits int64
}

// StreamKey is an ordering key, or (Keyed false) rows without one.
type StreamKey struct {
	Key   string
	Keyed bool
}

// KeyedRow is a pending row as Logical.ReadKeys returns it.
type KeyedRow struct {
	OutboxRow
	// Keyed tells that Key is an ordering key.
	Keyed bool
	// Due tells that the row may be published now; else Wait is how long
	// its retry waits.
	Due  bool
	Wait time.Duration
	// Holds tells that the row is not pending but a dead letter that
	// holds its key: the key's later rows wait behind it. Only its id and
	// key are read.
	Holds bool
}
