package storetest

import (
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// Migrations: versions applied once, concurrent migrators, and the error
// of a store whose tables are missing.
var migrationCases = []testCase{
	{"Migrate", testMigrate},
	{"MigrateConcurrent", testMigrateConcurrent},
	{"MigrateFromPreviousVersion", testMigrateFromPrevious},
	{"MigrateFingerprints", testMigrateFingerprints},
	{"MigrateHolds", testMigrateHolds},
	{"MigrateScheduled", testMigrateScheduled},
	{"MissingTable", testMissingTable},
	{"ObjectsListed", testObjectsListed},
	{"MigrationScript", testMigrationScript},
}

// testMigrate migrates a fresh dialect twice: the second run finds every
// version applied and changes nothing.
func testMigrate(e *env) {
	d := e.s.New(e.t)
	ms := d.Migrations()
	if len(ms) == 0 {
		e.t.Fatal("no migrations")
	}
	for i := 1; i < len(ms); i++ {
		if ms[i].Version <= ms[i-1].Version {
			e.t.Fatalf("migration %d listed after %d", ms[i].Version, ms[i-1].Version)
		}
	}
	if _, err := d.AppliedMigrations(e.ctx, e.db); !errors.Is(err, sqladapters.ErrMissingTable) {
		e.t.Fatalf("AppliedMigrations before migrating: %v, want ErrMissingTable", err)
	}
	for i := range 2 {
		if err := sqladapters.Migrate(e.ctx, e.db, d); err != nil {
			e.t.Fatalf("migration run %d: %v", i+1, err)
		}
		applied, err := d.AppliedMigrations(e.ctx, e.db)
		e.check(err, "AppliedMigrations")
		if len(applied) != len(ms) || applied[0] != ms[0].Version || applied[len(applied)-1] != ms[len(ms)-1].Version {
			e.t.Fatalf("applied versions %v after migrating, want those of %d migrations", applied, len(ms))
		}
	}
	e.d = d
	e.insert(msg("a", "", 0))
	if err := sqladapters.Migrate(e.ctx, e.db, d); err != nil {
		e.t.Fatalf("migration over data: %v", err)
	}
	if got := e.pending(sqladapters.PendingQuery{Limit: 10}); len(got) != 1 {
		e.t.Fatalf("%d rows pending after migrating again, want 1", len(got))
	}
	e.noneInUse("Migrate")
}

// testMigrateConcurrent migrates one fresh dialect from ten goroutines
// at once, as the instances of a fleet starting for the first time do:
// every one succeeds.
func testMigrateConcurrent(e *env) {
	e.d = e.s.New(e.t)
	errs := make(chan error, 10)
	for range cap(errs) {
		go func() { errs <- sqladapters.Migrate(e.ctx, e.db, e.d) }()
	}
	e.check(errors.Join(collect(errs)...), "concurrent Migrate")
	e.insert(msg("a", "", 0))
	e.noneInUse("Migrate")
}

// collect waits for the results of cap(errs) goroutines and returns the
// errors among them.
func collect(errs chan error) []error {
	var out []error
	for range cap(errs) {
		if err := <-errs; err != nil {
			out = append(out, err)
		}
	}
	return out
}

// testMissingTable uses a dialect whose tables were never created: the
// outbox insert, the forwarder's read and the inbox fail with a
// *MissingTableError that says how to create them.
func testMissingTable(e *env) {
	e.d = e.s.New(e.t)
	want := func(op string, err error) {
		e.t.Helper()
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) {
			e.t.Fatalf("%s: want a *MissingTableError, got %v", op, err)
		}
		if mt.Dialect != e.d.Name() {
			e.t.Fatalf("%s: the error names dialect %q, want %q", op, mt.Dialect, e.d.Name())
		}
		if n := strings.Count(err.Error(), "sqladapters.Migrate"); n != 1 {
			e.t.Fatalf("%s: the error says %d times how to migrate: %v", op, n, err)
		}
		// Code running SQL of its own next to millbox's may classify an
		// error twice.
		if again := e.d.ClassifyError(err); again != err {
			e.t.Fatalf("%s: classifying the error again changed it to %v", op, again)
		}
	}
	_, err := e.d.ReadPending(e.ctx, e.db, sqladapters.PendingQuery{Limit: 10}, false)
	want("ReadPending", err)
	_, err = e.d.ReadPending(e.ctx, e.db, sqladapters.PendingQuery{Limit: 10}, true)
	want("ReadPending of a backlog", err)
	want("InsertOutbox", e.d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{msg("a", "", 0)}))
	_, err = e.d.RecordInbox(e.ctx, e.db, "c", "m")
	want("RecordInbox", err)
	tx, first, err := e.d.BeginRecordInbox(e.ctx, e.db, sql.TxOptions{}, "c", "m")
	want("BeginRecordInbox", err)
	if tx != nil || first {
		e.t.Fatalf("BeginRecordInbox failed but returned a transaction (%v) or first (%v)", tx, first)
	}
	e.noneInUse("a failed BeginRecordInbox")
}

// migrateTo migrates a fresh dialect to the versions below version only,
// as an installation of an earlier release has them, and returns it with
// the versions it left out.
func (e *env) migrateTo(version int) (sqladapters.Dialect, []sqladapters.Migration) {
	e.t.Helper()
	d := e.s.New(e.t)
	e.d = d
	var ms, rest []sqladapters.Migration
	for _, m := range d.Migrations() {
		if m.Version < version {
			ms = append(ms, m)
		} else {
			rest = append(rest, m)
		}
	}
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	if err := d.Migrate(e.ctx, tx, ms); err != nil {
		sqladapters.Rollback(tx)
		e.t.Fatalf("migrate to version %d: %v", ms[len(ms)-1].Version, err)
	}
	e.check(tx.Commit(e.ctx), "commit")
	return d, rest
}

// outboxIDs returns the ids in the outbox table, read without the
// dialect.
func (e *env) outboxIDs() []int64 {
	e.t.Helper()
	rows, err := e.db.Query(e.ctx, `SELECT id FROM `+e.d.OutboxTable()+` ORDER BY id`)
	e.check(err, "select ids")
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var x int64
		e.check(rows.Scan(&x), "scan id")
		out = append(out, x)
	}
	e.check(rows.Err(), "select ids")
	return out
}

// testMigrateFromPrevious migrates an installation of the previous
// version, whose outbox held every row, with rows in every state to the
// latest, where dead letters and kept rows have tables of their own:
// pending, retrying and requeued rows stay pending in the outbox with
// their state; dead letters move with their errors, fingerprints and
// times, kept rows with their publication times; nothing is lost or
// doubled. Requeue, discard and prune work on the moved rows, and a
// requeued dead letter is read before the later rows of its key. The
// latest version's statements run again change nothing.
func testMigrateFromPrevious(e *env) {
	d, rest := e.migrateTo(5)
	if len(rest) == 0 || rest[0].Version != 5 {
		e.t.Fatalf("versions after 4: %+v, want 5 first", rest)
	}
	// The previous version's rows, written as it wrote them.
	e.check(d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{
		msg("pending", "", 1), msg("retrying", "r", 2), msg("dead", "k", 3), msg("dead-old", "", 4),
		msg("kept", "", 5), msg("requeued", "", 6), msg("after-dead", "k", 3),
	}), "InsertOutbox")
	id := e.outboxIDs()
	if len(id) != 7 {
		e.t.Fatalf("%d rows written, want 7", len(id))
	}
	later := map[string]string{"postgres": `'2999-01-01 00:00:00+00'`, "mysql": `'2999-01-01 00:00:00'`, "sqlite": `'2999-01-01T00:00:00.000Z'`}[d.Name()]
	set := func(i int, set string) {
		e.t.Helper()
		e.exec(`UPDATE ` + d.OutboxTable() + ` SET ` + set + ` WHERE id = ` + fmt.Sprint(id[i]))
	}
	fp := func(text string) string {
		f := sqladapters.FingerprintError(text)
		return map[string]string{"postgres": `'\x` + hex.EncodeToString(f[:]) + `'::bytea`, "mysql": `X'` + hex.EncodeToString(f[:]) + `'`,
			"sqlite": `X'` + hex.EncodeToString(f[:]) + `'`}[d.Name()]
	}
	set(1, `attempts = 2, last_error = 'timeout', error_fp = `+fp("timeout")+`, next_attempt_at = `+later)
	set(2, `attempts = 3, last_error = 'broker down', error_fp = `+fp("broker down")+`, dead_at = created_at`)
	set(3, `attempts = 5, last_error = 'recorded before fingerprints', dead_at = created_at`)
	set(4, `published_at = created_at`)
	set(5, `requeued_at = created_at, last_error = 'was dead'`)

	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate to the latest version")

	if got, want := e.outboxIDs(), []int64{id[0], id[1], id[5], id[6]}; !slices.Equal(got, want) {
		e.t.Fatalf("outbox after the migration: %v, want the pending, retrying, requeued and later rows %v", got, want)
	}
	if n, k := e.count(e.table("_dead")), e.count(e.table("_kept")); n != 2 || k != 1 {
		e.t.Fatalf("%d dead letters and %d kept rows after the migration, want 2 and 1", n, k)
	}
	// The retrying row still backs off and holds nothing but its own key;
	// the dead letter no longer holds its key back.
	pending := e.pending(sqladapters.PendingQuery{Limit: 10})
	if got := ids(pending); !slices.Equal(got, []int64{id[0], id[5], id[6]}) {
		e.t.Fatalf("pending after the migration: %v, want %v", got, []int64{id[0], id[5], id[6]})
	}
	e.check(d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{msg("retrying-later", "r", 2)}), "InsertOutbox")
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); len(got) != 3 {
		e.t.Fatalf("pending with the retrying key's later row: %v, want it held back", got)
	}
	dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10, Payloads: true})
	if len(dls) != 2 || dls[0].ID != id[2] || dls[0].UUID != "dead" || dls[0].Key != "k" || dls[0].Attempts != 3 || dls[0].LastError != "broker down" ||
		dls[0].Fingerprint != sqladapters.FingerprintError("broker down") || string(dls[0].Payload) != "payload of dead" || dls[0].DeadAt.IsZero() ||
		dls[1].ID != id[3] || dls[1].Attempts != 5 || !dls[1].Fingerprint.IsZero() {
		e.t.Fatalf("dead letters after the migration: %+v", dls)
	}
	gs, err := d.GroupDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}, 10)
	e.check(err, "GroupDeadLetters")
	if len(gs) != 2 {
		e.t.Fatalf("error groups after the migration: %+v", gs)
	}
	if n, err := d.CountForwardedBefore(e.ctx, e.db, time.Now().Add(time.Hour)); err != nil || n != 1 {
		e.t.Fatalf("kept rows after the migration: %d, %v", n, err)
	}
	ts, err := d.TopicStats(e.ctx, e.db)
	e.check(err, "TopicStats")
	var st sqladapters.TopicStats
	for _, t := range ts {
		st.Pending += t.Pending
		st.Retrying += t.Retrying
		st.Dead += t.Dead
		st.ForwardedKept += t.ForwardedKept
	}
	if st.Pending != 5 || st.Retrying != 1 || st.Dead != 2 || st.ForwardedKept != 1 {
		e.t.Fatalf("topic stats after the migration: %+v", st)
	}

	// The migrated rows move as rows written after it: the dead letter
	// goes back ahead of its key's later row, the kept row is pruned, the
	// old dead letter is discarded.
	if n, err := d.RequeueDeadLetters(e.ctx, e.db, id[2:3]); err != nil || n != 1 {
		e.t.Fatalf("requeue after the migration: %d, %v", n, err)
	}
	if got := e.pendingIDs(sqladapters.PendingQuery{Limit: 10}); len(got) != 4 || got[1] != id[2] || got[3] != id[6] {
		e.t.Fatalf("pending after requeueing the migrated dead letter: %v, want it before %d", got, id[6])
	}
	if n, err := d.DiscardDeadLetters(e.ctx, e.db, id[3:4]); err != nil || n != 1 {
		e.t.Fatalf("discard after the migration: %d, %v", n, err)
	}
	if n, err := d.DeleteForwarded(e.ctx, e.db, id[4:5]); err != nil || n != 1 {
		e.t.Fatalf("prune after the migration: %d, %v", n, err)
	}

	// Run again, version 5's statements find their work done.
	tx, err := e.db.Begin(e.ctx, sql.TxOptions{})
	e.check(err, "begin")
	for _, stmt := range rest[0].Statements {
		if _, err := tx.Exec(e.ctx, stmt); err != nil {
			sqladapters.Rollback(tx)
			e.t.Fatalf("version 5's statement again: %v\n%s", err, stmt)
		}
	}
	e.check(tx.Commit(e.ctx), "commit")
	if got := e.outboxIDs(); len(got) != 6 {
		e.t.Fatalf("outbox after the statements ran again: %v, want the 6 rows to go", got)
	}
	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate again")
	e.noneInUse("Migrate")
}

// testMigrateFingerprints migrates an installation made before error
// fingerprints (version 3) that holds dead and retrying rows to the
// latest: the error groups of the rows that failed before are found by
// their fingerprints, as those of the rows that fail after.
func testMigrateFingerprints(e *env) {
	d, _ := e.migrateTo(4)
	e.check(d.InsertOutbox(e.ctx, e.db, msgs("v", 4)), "InsertOutbox")
	id := e.outboxIDs()
	// A failure as version 3 records it: no fingerprint.
	record := func(id int64, errText string, dead bool) {
		e.t.Helper()
		set := `attempts = 3, last_error = '` + errText + `'`
		if dead {
			set += `, dead_at = created_at`
		}
		e.exec(`UPDATE ` + d.OutboxTable() + ` SET ` + set + ` WHERE id = ` + fmt.Sprint(id))
	}
	record(id[0], "broker down", true)
	record(id[1], "broker down", true)
	record(id[2], "schema mismatch: ключ", true)
	record(id[3], "retrying", false)

	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate to the latest version")
	// Fails after the migration.
	later := e.insert(msg("after", "", 0))
	e.kill("broker down", later...)

	gs, err := d.GroupDeadLetters(e.ctx, e.db, sqladapters.DeadLetterFilter{}, 10)
	e.check(err, "GroupDeadLetters")
	if len(gs) != 2 || gs[0].Error != "broker down" || gs[0].Count != 3 || gs[0].Fingerprint != sqladapters.FingerprintError("broker down") ||
		gs[1].Error != "schema mismatch: ключ" || gs[1].Fingerprint != sqladapters.FingerprintError("schema mismatch: ключ") {
		e.t.Fatalf("groups after the migration: %+v", gs)
	}
	fp := gs[0].Fingerprint
	dls := e.dead(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{Fingerprint: &fp}, Limit: 10})
	if got := deadIDs(dls); !slices.Equal(got, []int64{id[0], id[1], later[0]}) {
		e.t.Fatalf("the group of broker down after the migration: %v", got)
	}
	// The retrying row got its fingerprint too: it keeps it when it dies.
	e.kill("retrying", id[3])
	if dl := e.dead(sqladapters.DeadLetterQuery{Filter: sqladapters.DeadLetterFilter{IDs: id[3:]}, Limit: 1}); len(dl) != 1 || dl[0].Fingerprint != sqladapters.FingerprintError("retrying") {
		e.t.Fatalf("the retrying row after the migration: %+v", dl)
	}
	e.noneInUse("Migrate")
}

// testMigrateHolds migrates an installation of version 5 with a dead
// letter, recorded there by a forwarder without holds, to the latest: the
// dead letter holds nothing, and dead letters recorded after hold their
// keys when asked to.
func testMigrateHolds(e *env) {
	d, rest := e.migrateTo(6)
	if len(rest) == 0 || rest[0].Version != 6 {
		e.t.Fatalf("versions after 5: %+v, want 6 first", rest)
	}
	e.check(d.InsertOutbox(e.ctx, e.db, []sqladapters.OutboxMessage{msg("old-dead", "k", 1), msg("later", "k", 1), msg("new-dead", "n", 2), msg("new-later", "n", 2)}), "InsertOutbox")
	id := e.outboxIDs()
	// A forwarder of this version without holds records a dead letter on
	// the schema of version 5, as during an upgrade.
	e.fail(sqladapters.Failure{ID: id[0], Attempts: 3, Error: "old", Dead: true})

	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate to the latest version")
	if dls := e.dead(sqladapters.DeadLetterQuery{Limit: 10}); len(dls) != 1 || dls[0].ID != id[0] || dls[0].Holds {
		e.t.Fatalf("dead letters after the migration: %+v, want %d holding nothing", dls, id[0])
	}
	e.fail(sqladapters.Failure{ID: id[2], Attempts: 3, Error: "new", Dead: true, Hold: true})
	if got, want := e.pendingIDs(sqladapters.PendingQuery{DeadLetterHolds: true, Limit: 10}), id[1:2]; !slices.Equal(got, want) {
		e.t.Fatalf("held read after the migration: %v, want %v", got, want)
	}
	if st := e.stats(); st.HeldKeys != 1 || st.Dead != 2 {
		e.t.Fatalf("stats after the migration: %+v", st)
	}
	e.noneInUse("Migrate")
}

// testObjectsListed migrates and then reads the database's catalog: every
// table, index and sequence named after the outbox or the inbox is on the
// list of the names the migrations create (sqlstore.Builder.Objects),
// which the dialect's constructor checks table names against and Tables
// reports, so that no name a migration adds escapes that check.
func testObjectsListed(e *env) {
	d := e.migrated()
	b, ok := sqlstore.BuilderOf(d)
	if !ok {
		e.t.Fatalf("%T has no SQL builder", d)
	}
	objs := b.Objects()
	fold := d.Name() != "postgres"
	base := func(qualified string) string {
		return strings.Trim(qualified[strings.LastIndex(qualified, ".")+1:], "\"`")
	}
	outbox, inbox := base(d.OutboxTable()), base(d.InboxTable())
	var q string
	switch d.Name() {
	case "postgres":
		schema, err := d.CurrentSchema(e.ctx, e.db)
		e.check(err, "CurrentSchema")
		q = `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '` + schema + `'`
	case "mysql":
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()`
	case "sqlite":
		q = `SELECT name FROM sqlite_master`
	default:
		e.t.Fatalf("no catalog query for %s", d.Name())
	}
	rows, err := e.db.Query(e.ctx, q)
	e.check(err, "read the catalog")
	var found []string
	for rows.Next() {
		var name string
		e.check(rows.Scan(&name), "scan the catalog")
		if l := strings.ToLower(name); strings.HasPrefix(l, strings.ToLower(outbox)) || strings.HasPrefix(l, strings.ToLower(inbox)) {
			found = append(found, name)
		}
	}
	rows.Close()
	e.check(rows.Err(), "read the catalog")
	if len(found) == 0 {
		e.t.Fatalf("the catalog holds nothing named after %s or %s", outbox, inbox)
	}
	for _, name := range found {
		if !slices.ContainsFunc(objs, func(o sqlstore.Object) bool { return o.Matches(name, fold) }) {
			e.t.Fatalf("the migrations created %q, which the %s builder's Objects does not list: table names are not checked against it", name, d.Name())
		}
	}
	tabler, ok := d.(interface{ Tables() []string })
	if !ok {
		e.t.Fatalf("%T does not list its tables", d)
	}
	tables := sqlstore.TableNames(objs)
	for i, t := range tabler.Tables() {
		if i >= len(tables) || base(t) != tables[i] {
			e.t.Fatalf("Tables reports %v, the objects list the tables %v", tabler.Tables(), tables)
		}
		if !slices.ContainsFunc(found, func(name string) bool { return sqlstore.Object{Name: tables[i]}.Matches(name, fold) }) {
			e.t.Fatalf("the table %s that Tables reports is not in the catalog", t)
		}
	}
}

// testMigrationScript reads the script for migration tools: it names the
// database and tables, and holds every statement of every version, in
// order, after the comment naming the version.
func testMigrationScript(e *env) {
	d := e.s.New(e.t)
	script := d.MigrationScript()
	if !strings.HasPrefix(script, "-- millbox schema for "+d.Name()) || !strings.Contains(strings.SplitN(script, "\n", 2)[0], d.OutboxTable()) {
		e.t.Fatalf("the script does not start naming the database and the outbox:\n%.300s", script)
	}
	at := 0
	for _, m := range d.Migrations() {
		for _, stmt := range append([]string{fmt.Sprintf("-- millbox %s migration %d: %s\n", d.Name(), m.Version, m.Name)}, m.Statements...) {
			i := strings.Index(script[at:], strings.TrimSpace(stmt))
			if i < 0 {
				e.t.Fatalf("the script lacks, after byte %d, a statement of version %d:\n%s", at, m.Version, stmt)
			}
			at += i + len(strings.TrimSpace(stmt))
		}
	}
}
