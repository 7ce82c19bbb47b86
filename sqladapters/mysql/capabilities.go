package mysql

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// The operations not every database has (see sqlstore.Builder) that MySQL
// lacks, each with the reason; those it has are written next to the
// statements they go with.

// PendingHorizon returns false: MySQL tells no running transaction's place
// in the order of ids, so a forwarder cannot learn that no row below an id
// can appear any more; it reads from the first pending row.
func (d *sqlDialect) PendingHorizon() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// PendingReadSetup returns none: the pending read needs no settings of
// its own.
func (d *sqlDialect) PendingReadSetup() []sqladapters.Query { return nil }

// NotifyProbe returns false: MySQL has no notifications.
func (d *sqlDialect) NotifyProbe() (sqladapters.Query, bool) { return sqladapters.Query{}, false }

// DeleteInboxRange returns false: InnoDB purges the index entries of
// deleted rows in the background, so DeleteInboxBefore's batches, each
// from the start of received_idx, walk few of them.
func (d *sqlDialect) DeleteInboxRange(time.Time, time.Time, int) (sqladapters.Query, bool) {
	return sqladapters.Query{}, false
}

// Logical returns nil: MySQL's binary log is not a change stream millbox
// reads.
func (d *sqlDialect) Logical() sqlstore.Logical { return nil }

// FingerprintBackfill returns nil: migration 4 fingerprints the recorded
// errors in SQL (SHA2).
func (d *sqlDialect) FingerprintBackfill() sqlstore.FingerprintBackfill { return nil }
