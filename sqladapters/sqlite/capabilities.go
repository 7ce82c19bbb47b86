package sqlite

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// The operations not every database has (see sqlstore.Builder) that
// SQLite lacks, each with the reason, and the fingerprint backfill it
// needs; those it has are written next to the statements they go with.

// PendingHorizon returns false: a deleted row leaves the primary key at
// once, so the pending read walks no deleted rows a horizon would skip.
func (d *sqlDialect) PendingHorizon() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// PendingReadSetup returns none: the pending read needs no settings of
// its own.
func (d *sqlDialect) PendingReadSetup() []sqladapters.Query { return nil }

// NotifyProbe returns false: SQLite has no notifications.
func (d *sqlDialect) NotifyProbe() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// DeleteInboxRange returns false: a deleted row leaves received_idx at
// once, so DeleteInboxBefore serves.
func (d *sqlDialect) DeleteInboxRange(time.Time, time.Time, int) (sqladapters.Query, bool) {
	return sqladapters.Query{}, false
}

// Logical returns nil: SQLite cannot stream its changes.
func (d *sqlDialect) Logical() sqlstore.Logical { return nil }

// FingerprintBackfill returns the statements that fingerprint the errors
// recorded before migration 4: SQLite cannot hash in SQL.
func (d *sqlDialect) FingerprintBackfill() sqlstore.FingerprintBackfill { return d }
