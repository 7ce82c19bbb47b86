package sqladapters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Migrate brings the millbox tables described by d up to the latest
// version. It is safe to call from many processes at once: migrators take a
// lock first, and a version that is already applied is skipped. On
// databases without transactional DDL (MySQL) statements commit one by one.
func Migrate(ctx context.Context, db DB, d Dialect) error {
	if db == nil {
		return errors.New("millbox: Migrate: nil DB")
	}
	if d == nil {
		return errors.New("millbox: Migrate: nil Dialect")
	}
	return migrateRetrying(ctx, db, d.ClassifyError, func(tx Tx) error { return migrate(ctx, tx, d) })
}

// MigrateFleet brings the control tables of a forwarder fleet described
// by s up to the latest version, as Migrate does for an outbox: safe from
// many processes at once, versions applied once, statements committed one
// by one on MySQL.
func MigrateFleet(ctx context.Context, db DB, s FleetStore) error {
	if db == nil {
		return errors.New("millbox: MigrateFleet: nil DB")
	}
	if s == nil {
		return errors.New("millbox: MigrateFleet: nil FleetStore")
	}
	return migrateRetrying(ctx, db, s.ClassifyError, func(tx Tx) error {
		if err := s.Migrate(ctx, tx, s.Migrations()); err != nil {
			return fmt.Errorf("millbox: fleet: %w", err)
		}
		return nil
	})
}

// migrateRetrying runs migrate in transactions of its own until it
// succeeds, fails with anything but a duplicate key, or ran
// migrateAttempts times (see migrateOnce).
func migrateRetrying(ctx context.Context, db DB, classify func(error) error, migrate func(Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := migrateOnce(ctx, db, migrate)
		if err == nil || attempt == migrateAttempts || !errors.Is(classify(err), ErrDuplicate) {
			return err
		}
	}
}

// migrateAttempts bounds the transactions Migrate runs when one fails with
// a duplicate key (see migrateOnce).
const migrateAttempts = 3

// migrateOnce runs the migrations in a transaction of their own. Migrators
// take the dialect's lock, so they run one after the other; but a
// PostgreSQL session that looked a schema up before another migrator
// created it may keep seeing it missing until its next transaction
// (its catalog cache is refreshed when a transaction starts or a table is
// locked, not when an advisory lock is granted), and then fails with a
// duplicate key creating it again. The next attempt sees the schema.
func migrateOnce(ctx context.Context, db DB, migrate func(Tx) error) error {
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return fmt.Errorf("millbox: begin migration: %w", err)
	}
	if err := migrate(tx); err != nil {
		Rollback(tx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("millbox: commit migration: %w", err)
	}
	return nil
}

// MigrateTx runs the migrations inside the caller's transaction, so the
// millbox tables appear together with the caller's own schema changes. It
// refuses dialects without transactional DDL (MySQL), where the first
// CREATE TABLE would silently commit the caller's transaction.
func MigrateTx(ctx context.Context, tx Tx, d Dialect) error {
	if tx == nil {
		return fmt.Errorf("millbox: MigrateTx: %w", ErrNoTx)
	}
	if d == nil {
		return errors.New("millbox: MigrateTx: nil Dialect")
	}
	if !d.Features().TransactionalDDL {
		return fmt.Errorf("millbox: MigrateTx: %s commits DDL implicitly, which would commit your transaction; use Migrate", d.Name())
	}
	return migrate(ctx, tx, d)
}

func migrate(ctx context.Context, tx Tx, d Dialect) error {
	if err := d.Migrate(ctx, tx, d.Migrations()); err != nil {
		return fmt.Errorf("millbox: %w", err)
	}
	return nil
}

// MigrationSQL returns the schema statements Migrate applies, version by
// version, as a script for migration tools such as goose, atlas or flyway.
// It leaves out Migrate's own bookkeeping (lock and version table), and
// the statement creating a configured schema: Dialect.MigrationScript
// adds it.
func MigrationSQL(d Dialect) string {
	var b strings.Builder
	for _, m := range d.Migrations() {
		fmt.Fprintf(&b, "-- millbox %s migration %d: %s\n", d.Name(), m.Version, m.Name)
		for _, s := range m.Statements {
			b.WriteString(strings.TrimSpace(s))
			b.WriteString(";\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// Rollback rolls tx back under a fresh short timeout, so a cancelled
// caller context never leaves a transaction open. Its error is ignored on
// purpose: it is only called on paths that already return an error.
func Rollback(tx Tx) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = tx.Rollback(ctx)
}
