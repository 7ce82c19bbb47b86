package integration_test

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/sqlite"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// firstMigration is a dialect whose migrations end at version 1, as an
// installation made before version 2 existed has them.
type firstMigration struct{ sqladapters.Dialect }

func (f firstMigration) Migrations() []sqladapters.Migration { return f.Dialect.Migrations()[:1] }

// TestUpgradeFromVersion1 migrates an installation of version 1 that holds
// rows, one of them waiting for a retry, to the latest version: the rows
// keep their order rules, and ordering keys of any length then work.
func TestUpgradeFromVersion1(t *testing.T) {
	t.Run("Postgres", func(t *testing.T) {
		pool := testenv.Postgres(t)
		d := postgres.MustNew(postgres.Options{Schema: testenv.PostgresSchema(t, pool)})
		upgradeFromVersion1(t, &dialectOps{t: t, ctx: testenv.Ctx(t, time.Minute), db: pgxv5.WrapPool(pool), d: d})
	})
	t.Run("MySQL", func(t *testing.T) {
		raw := testenv.MySQL(t)
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		upgradeFromVersion1(t, &dialectOps{t: t, ctx: testenv.Ctx(t, time.Minute), db: stdsql.WrapDB(raw), d: d})
	})
	t.Run("SQLite", func(t *testing.T) {
		db := stdsql.WrapDB(testenv.SQLite(t, testenv.SQLitePath(t)))
		upgradeFromVersion1(t, &dialectOps{t: t, ctx: testenv.Ctx(t, time.Minute), db: db, d: sqlite.MustNew(sqlite.Options{})})
	})
}

func upgradeFromVersion1(t *testing.T, o *dialectOps) {
	if err := sqladapters.Migrate(o.ctx, o.db, firstMigration{o.d}); err != nil {
		t.Fatalf("migrate to version 1: %v", err)
	}
	ids := o.insert(
		sqladapters.OutboxMessage{UUID: "a1", Key: "a", KeyHash: 7},
		sqladapters.OutboxMessage{UUID: "a2", Key: "a", KeyHash: 7},
		sqladapters.OutboxMessage{UUID: "b1", Key: "b", KeyHash: 7},
	)
	// A failure as version 1 records it, waiting for a retry until long
	// after the test.
	later := map[string]string{"postgres": `'2999-01-01 00:00:00+00'`, "mysql": `'2999-01-01 00:00:00'`, "sqlite": `'2999-01-01T00:00:00.000Z'`}[o.d.Name()]
	o.exec(sqladapters.Query{SQL: `UPDATE ` + o.d.OutboxTable() + ` SET attempts = 1, last_error = 'down', next_attempt_at = ` + later +
		` WHERE id = ` + strconv.FormatInt(ids[0], 10)})
	if err := sqladapters.Migrate(o.ctx, o.db, o.d); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	if got := o.ints(sqladapters.Query{SQL: `SELECT version FROM ` + tableOf(t, o.d, "_migrations") + ` ORDER BY version`}); len(got) != len(o.d.Migrations()) {
		t.Fatalf("applied versions %v, want all %d", got, len(o.d.Migrations()))
	}
	// a1 still waits for its retry and holds a2 back; b shares a's hash
	// and goes ahead.
	if got := uuidsOf(o.pending(sqladapters.PendingQuery{})); got != "b1" {
		t.Fatalf("after the upgrade, pending %s; want b1 alone", got)
	}
	// The failure recorded before has its error's fingerprint.
	o.fail(sqladapters.Failure{ID: ids[0], Attempts: 2, Error: "down", Dead: true})
	if dead := o.deadLetters(); len(dead) != 1 || dead[0].Fingerprint != sqladapters.FingerprintError("down") {
		t.Fatalf("the dead letter after the upgrade: %+v", dead)
	}
	if n, err := o.d.RequeueDeadLetters(o.ctx, o.db, ids[:1]); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	o.fail(sqladapters.Failure{ID: ids[0], Attempts: 1, Error: "down", Backoff: time.Hour})
	// A key longer than any index entry backs off, is dead-lettered and
	// holds back its later rows until then.
	b := make([]byte, 70<<10)
	_, _ = rand.Read(b)
	long := base64.RawURLEncoding.EncodeToString(b)[:70<<10]
	ids = o.insert(
		sqladapters.OutboxMessage{UUID: "l1", Key: long, KeyHash: 9},
		sqladapters.OutboxMessage{UUID: "l2", Key: long, KeyHash: 9},
	)
	o.fail(sqladapters.Failure{ID: ids[0], Attempts: 1, Error: "down", Backoff: time.Hour})
	if got := uuidsOf(o.pending(sqladapters.PendingQuery{})); got != "b1" {
		t.Fatalf("with l1 backing off, pending %s; want b1 alone", got)
	}
	o.fail(sqladapters.Failure{ID: ids[0], Attempts: 2, Error: "gone", Dead: true})
	if got := uuidsOf(o.pending(sqladapters.PendingQuery{})); got != "b1 l2" {
		t.Fatalf("with l1 dead, pending %s; want b1 l2", got)
	}
}

// TestMigrateWithoutInbox migrates an outbox without its inbox, as an
// application that only publishes does: the outbox works, the inbox fails
// with a MissingTableError that says how to migrate, and migrating again
// without the option creates it.
func TestMigrateWithoutInbox(t *testing.T) {
	t.Run("Postgres", func(t *testing.T) {
		pool := testenv.Postgres(t)
		opts := postgres.Options{Schema: testenv.PostgresSchema(t, pool)}
		without := opts
		without.WithoutInbox = true
		migrateWithoutInbox(t, pgxv5.WrapPool(pool), postgres.MustNew(without), postgres.MustNew(opts))
	})
	t.Run("MySQL", func(t *testing.T) {
		raw := testenv.MySQL(t)
		opts := testenv.MySQLNames(t, raw, mysql.Options{})
		without := opts
		without.WithoutInbox = true
		migrateWithoutInbox(t, stdsql.WrapDB(raw), mysql.MustNew(without), mysql.MustNew(opts))
	})
	t.Run("SQLite", func(t *testing.T) {
		db := stdsql.WrapDB(testenv.SQLite(t, testenv.SQLitePath(t)))
		migrateWithoutInbox(t, db, sqlite.MustNew(sqlite.Options{WithoutInbox: true}), sqlite.MustNew(sqlite.Options{}))
	})
}

func migrateWithoutInbox(t *testing.T, db sqladapters.DB, without, with sqladapters.Dialect) {
	ctx := testenv.Ctx(t, time.Minute)
	if err := sqladapters.Migrate(ctx, db, without); err != nil {
		t.Fatalf("migrate without the inbox: %v", err)
	}
	o := &dialectOps{t: t, ctx: ctx, db: db, d: without}
	o.insert(sqladapters.OutboxMessage{UUID: "a1", Key: "a", KeyHash: 7})
	if got := uuidsOf(o.pending(sqladapters.PendingQuery{})); got != "a1" {
		t.Fatalf("pending %q, want a1", got)
	}
	_, err := without.RecordInbox(ctx, db, "billing", "m1")
	var missing *sqladapters.MissingTableError
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
		t.Fatalf("inbox without its table: %v; want a MissingTableError that says how to migrate", err)
	}
	if err := sqladapters.Migrate(ctx, db, with); err != nil {
		t.Fatalf("migrate with the inbox: %v", err)
	}
	if first, err := with.RecordInbox(ctx, db, "billing", "m1"); err != nil || !first {
		t.Fatalf("inbox after migrating with it: %v, %v", first, err)
	}
	if got := uuidsOf(o.pending(sqladapters.PendingQuery{})); got != "a1" {
		t.Fatalf("pending after the second migration %q, want a1", got)
	}
}
