package postgres

import "github.com/millbox/millbox/sqladapters/internal/sqlstore"

// PostgreSQL has every operation not every database has (see
// sqlstore.Builder) but the fingerprint backfill; they are written next
// to the statements they go with.

// Logical returns the statements of the change-data-capture source.
func (d *sqlDialect) Logical() sqlstore.Logical { return d }

// FingerprintBackfill returns nil: migration 4 fingerprints the recorded
// errors in SQL.
func (d *sqlDialect) FingerprintBackfill() sqlstore.FingerprintBackfill { return nil }
