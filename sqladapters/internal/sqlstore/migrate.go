package sqlstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Migrator builds the bookkeeping statements of one set of versioned
// tables: the lock that serializes migrators and the table recording the
// applied versions. The outbox's Builder and the fleet's FleetBuilder are
// both one.
type Migrator interface {
	// LockMigrations returns the statement that serializes concurrent
	// migrators and the one that releases it. Unlock is a zero Query when
	// the lock ends with the transaction.
	LockMigrations() (lock, unlock sqladapters.Query)
	// CreateMigrationsTable creates the table recording applied versions
	// (and the schema or database holding it, where the names are
	// qualified with one).
	CreateMigrationsTable() []sqladapters.Query
	// AppliedMigrations selects the applied versions (one int column).
	AppliedMigrations() sqladapters.Query
	// RecordMigration records version as applied.
	RecordMigration(version int, name string) sqladapters.Query
}

// runMigrations applies in tx those of migrations that are not applied
// yet, in their order, under m's lock, and records each; after, when set,
// runs right after a version's statements, before it is recorded.
func runMigrations(ctx context.Context, tx sqladapters.Tx, m Migrator, migrations []sqladapters.Migration,
	after func(sqladapters.Migration) error) (err error) {
	lock, unlock := m.LockMigrations()
	if lock.SQL != "" {
		if _, err := lock.Exec(ctx, tx); err != nil {
			return fmt.Errorf("take migration lock: %w", err)
		}
		if unlock.SQL != "" {
			// A lock that outlives the transaction (MySQL's GET_LOCK
			// belongs to the connection) must be released on failure too,
			// or the pooled connection keeps it and blocks every later
			// migrator.
			defer func() {
				if err != nil {
					uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
					defer cancel()
					_, _ = unlock.Exec(uctx, tx)
				}
			}()
		}
	}
	for _, q := range m.CreateMigrationsTable() {
		if _, err := q.Exec(ctx, tx); err != nil {
			return fmt.Errorf("create migrations table: %w", err)
		}
	}
	applied := map[int]bool{}
	if err := scanApplied(ctx, tx, m.AppliedMigrations(), applied); err != nil {
		return fmt.Errorf("read applied migrations: %w", err)
	}
	for _, mig := range migrations {
		if applied[mig.Version] {
			continue
		}
		for _, stmt := range mig.Statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("migration %d (%s): %w", mig.Version, mig.Name, err)
			}
		}
		if after != nil {
			if err := after(mig); err != nil {
				return err
			}
		}
		if _, err := m.RecordMigration(mig.Version, mig.Name).Exec(ctx, tx); err != nil {
			return fmt.Errorf("record migration %d: %w", mig.Version, err)
		}
	}
	if unlock.SQL != "" {
		if _, err := unlock.Exec(ctx, tx); err != nil {
			return fmt.Errorf("release migration lock: %w", err)
		}
	}
	return nil
}

// appliedMigrations returns the versions recorded as applied, ascending.
func appliedMigrations(ctx context.Context, e sqladapters.Executor, m Migrator) ([]int, error) {
	applied := map[int]bool{}
	if err := scanApplied(ctx, e, m.AppliedMigrations(), applied); err != nil {
		return nil, err
	}
	out := make([]int, 0, len(applied))
	for v := range applied {
		out = append(out, v)
	}
	slices.Sort(out)
	return out, nil
}

// scanApplied reads the applied versions into applied.
func scanApplied(ctx context.Context, e sqladapters.Executor, q sqladapters.Query, applied map[int]bool) error {
	rows, err := q.Query(ctx, e)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return err
		}
		applied[v] = true
	}
	return rows.Err()
}

// migrationScript renders migrations as one SQL script: a head naming
// what it creates (title) and saying whether it may run again (note), the
// statements creating the schema or database, then each version's
// statements as sqladapters.MigrationSQL renders them (label names the
// versions, such as "postgres").
func migrationScript(title, note string, createSchema []sqladapters.Query, label string, migrations []sqladapters.Migration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- %s\n-- %s\n\n", title, note)
	for _, q := range createSchema {
		b.WriteString(q.SQL + ";\n\n")
	}
	for _, m := range migrations {
		fmt.Fprintf(&b, "-- millbox %s migration %d: %s\n", label, m.Version, m.Name)
		for _, s := range m.Statements {
			b.WriteString(strings.TrimSpace(s))
			b.WriteString(";\n")
		}
		b.WriteString("\n")
	}
	return b.String()
}
