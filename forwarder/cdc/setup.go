package cdc

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
)

// slotNameRe is PostgreSQL's rule for replication slot names.
var slotNameRe = regexp.MustCompile(`^[a-z0-9_]+$`)

var (
	// ErrWalLevel is returned by Run when the server's wal_level is not
	// logical. The error says how to change it.
	ErrWalLevel = errors.New("millbox cdc: wal_level is not logical")
	// ErrNoReplicationRole is returned by Run when the role of
	// Config.ConnString lacks the REPLICATION attribute. The error says
	// how to grant it.
	ErrNoReplicationRole = errors.New("millbox cdc: role lacks REPLICATION")
	// ErrNotSetUp is returned by Run when the publication or the slot does
	// not exist and Config.CreateIfMissing is false.
	ErrNotSetUp = errors.New("millbox cdc: publication or replication slot missing")
	// ErrClosed is returned by Run and Ready after Close.
	ErrClosed = sqladapters.ErrClosed
)

// names are the unquoted names of the outbox table.
type names struct {
	schema, table string
	partitioned   bool
}

func outboxNames(d sqladapters.Dialect) (names, error) {
	pd, ok := d.(*postgres.Dialect)
	if !ok {
		return names{}, fmt.Errorf("%w: Config.Dialect must be a *postgres.Dialect, got %T", ErrInvalidConfig, d)
	}
	o := pd.Options()
	return names{schema: o.Schema, table: o.OutboxTable, partitioned: o.Partitioned != nil}, nil
}

// Setup creates the publication of the outbox table (inserts and updates)
// and the logical replication slot (plugin pgoutput) that Config names,
// skipping what exists. The slot starts at the current end of the WAL:
// rows already in the table are published through the polling path when
// the forwarder starts. Run it once per outbox, from a role allowed to
// create publications (owner of the table) with REPLICATION.
//
// Setup needs Config's ConnString, DB, Dialect, Slot and Publication, not
// its Publisher. A slot keeps every WAL segment from its confirmed
// position on: drop it with Drop when no forwarder will read it again.
func Setup(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validateDB(); err != nil {
		return err
	}
	n, err := outboxNames(cfg.Dialect)
	if err != nil {
		return err
	}
	return setup(ctx, cfg, n)
}

func setup(ctx context.Context, cfg Config, n names) error {
	exists, err := queryBool(ctx, cfg.DB, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, cfg.Publication)
	if err != nil {
		return fmt.Errorf("millbox cdc: look up publication: %w", cfg.Dialect.ClassifyError(err))
	}
	if !exists {
		with := `publish = 'insert, update'`
		if n.partitioned {
			with += `, publish_via_partition_root = true`
		}
		_, err := cfg.DB.Exec(ctx, `CREATE PUBLICATION "`+cfg.Publication+`" FOR TABLE `+cfg.Dialect.OutboxTable()+` WITH (`+with+`)`)
		if err != nil && !isDuplicateObject(err) {
			return fmt.Errorf("millbox cdc: create publication %s: %w", cfg.Publication, cfg.Dialect.ClassifyError(err))
		}
	}
	exists, err = queryBool(ctx, cfg.DB, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, cfg.Slot)
	if err != nil {
		return fmt.Errorf("millbox cdc: look up replication slot: %w", err)
	}
	if !exists {
		rows, err := cfg.DB.Query(ctx, `SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')`, cfg.Slot)
		if err == nil {
			for rows.Next() {
			}
			err = rows.Err()
			rows.Close()
		}
		if err != nil && !isDuplicateObject(err) {
			return fmt.Errorf("millbox cdc: create replication slot %s: %w", cfg.Slot, explain(err))
		}
	}
	return nil
}

// Drop drops the replication slot and the publication Config names, when
// they exist. The slot must not be in use: stop every forwarder first.
// Like Setup, it needs no Publisher.
func Drop(ctx context.Context, cfg Config) error {
	cfg.setDefaults()
	if err := cfg.validateDB(); err != nil {
		return err
	}
	rows, err := cfg.DB.Query(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, cfg.Slot)
	if err == nil {
		for rows.Next() {
		}
		err = rows.Err()
		rows.Close()
	}
	if err != nil {
		return fmt.Errorf("millbox cdc: drop replication slot %s: %w", cfg.Slot, err)
	}
	if _, err := cfg.DB.Exec(ctx, `DROP PUBLICATION IF EXISTS "`+cfg.Publication+`"`); err != nil {
		return fmt.Errorf("millbox cdc: drop publication %s: %w", cfg.Publication, err)
	}
	return nil
}

// preflight checks what Run needs and says how to fix what is missing.
func preflight(ctx context.Context, cfg Config, n names) error {
	rows, err := cfg.DB.Query(ctx, `SELECT current_setting('wal_level'), current_user::text,
	coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
	to_regclass($1) IS NOT NULL,
	EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2),
	EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $3)`, cfg.Dialect.OutboxTable(), cfg.Publication, cfg.Slot)
	if err != nil {
		return fmt.Errorf("millbox cdc: check the database: %w", cfg.Dialect.ClassifyError(err))
	}
	var walLevel, role string
	var repl, table, pub, slot bool
	if rows.Next() {
		err = rows.Scan(&walLevel, &role, &repl, &table, &pub, &slot)
	}
	if err == nil {
		err = rows.Err()
	}
	rows.Close()
	if err != nil {
		return fmt.Errorf("millbox cdc: check the database: %w", err)
	}
	switch {
	case walLevel != "logical":
		return fmt.Errorf("%w (it is %q): run ALTER SYSTEM SET wal_level = logical and restart PostgreSQL "+
			"(also make sure max_replication_slots and max_wal_senders are at least 1 more than in use)", ErrWalLevel, walLevel)
	case !repl:
		return fmt.Errorf("%w: role %q cannot start logical replication; run ALTER ROLE %q REPLICATION "+
			"(or connect Config.ConnString as a role that has it)", ErrNoReplicationRole, role, role)
	case !table:
		return &sqladapters.MissingTableError{Dialect: "postgres", Err: fmt.Errorf("relation %s does not exist", cfg.Dialect.OutboxTable())}
	case (!pub || !slot) && !cfg.CreateIfMissing:
		return fmt.Errorf("%w: publication %s exists: %v, slot %s exists: %v; create them with cdc.Setup, or set Config.CreateIfMissing",
			ErrNotSetUp, cfg.Publication, pub, cfg.Slot, slot)
	case !pub || !slot:
		return setup(ctx, cfg, n)
	}
	return nil
}

func queryBool(ctx context.Context, db sqladapters.Executor, q string, args ...any) (bool, error) {
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	var v bool
	if rows.Next() {
		if err := rows.Scan(&v); err != nil {
			return false, err
		}
	}
	return v, rows.Err()
}

type sqlStater interface{ SQLState() string }

func sqlState(err error) string {
	var se sqlStater
	if errors.As(err, &se) {
		return se.SQLState()
	}
	return ""
}

// isDuplicateObject tells a concurrent Setup that created it first.
func isDuplicateObject(err error) bool {
	s := sqlState(err)
	return s == "42710" || s == "23505"
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
