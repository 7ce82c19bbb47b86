package postgres

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const rowColumns = `o.id, o.topic, o.uuid, o.payload, o.metadata, o.key, o.attempts, o.key_hash`

// retrying is the predicate of the retry index: rows waiting for a
// retry. It names dead_at and published_at, always NULL since version 5,
// because the index was made with them (see ownTables); a statement that
// reads the index must repeat them for the planner to use it.
const retrying = `attempts > 0 AND dead_at IS NULL AND published_at IS NULL`

// SelectPending reads due rows in id order through the primary key: the
// outbox holds only rows that still have to go, so the read walks no dead
// or kept row. A row whose key has an earlier row backing off after a
// failure is left out, so the key keeps its order. The backoff check looks
// the key's hash up in the retry index, which holds only rows waiting for
// a retry, and then compares the full keys: keys of any length work, and a
// key sharing another's hash is not held back.
//
// The ids in q.Exclude are left out through NOT IN over a subquery, which
// Postgres runs once per execution into a hash table ("hashed SubPlan"),
// generic plan or not. The obvious "id <> ALL($n)" is hashed only in a
// custom plan; under the generic plan a prepared statement settles on, it
// compares every row with the whole list, ten times slower than reading
// those rows. Ids are never NULL, so NOT IN means what it says.
//
// With q.DeadLetterHolds, a row whose key has an earlier dead letter
// holding it is left out the same way: its key's hash is looked up in the
// dead letters' hold index, which holds only dead letters that hold their
// key.
func (d *sqlDialect) SelectPending(q sqladapters.PendingQuery) sqladapters.Query {
	var b strings.Builder
	var args []any
	b.WriteString(`SELECT ` + rowColumns + ` FROM ` + d.outbox + ` o
WHERE o.next_attempt_at <= now()`)
	if q.Owned != nil {
		b.WriteString(` AND o.key_hash % ` + strconv.Itoa(q.Partitions) + ` = ANY($` + strconv.Itoa(len(args)+1) + `::int[])`)
		args = append(args, intArray(q.Owned))
	}
	if len(q.Exclude) > 0 {
		b.WriteString(` AND o.id NOT IN (SELECT unnest($` + strconv.Itoa(len(args)+1) + `::bigint[]))`)
		args = append(args, idArray(q.Exclude))
	}
	if q.After > 0 {
		b.WriteString(` AND o.id > $` + strconv.Itoa(len(args)+1))
		args = append(args, q.After)
	}
	if len(q.SkipKeys) > 0 {
		b.WriteString(` AND (o.key IS NULL OR o.key <> ALL($` + strconv.Itoa(len(args)+1) + `::text[]))`)
		args = append(args, textArray(q.SkipKeys))
	}
	if q.DeadLetterHolds {
		b.WriteString(`
AND (o.key IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.dead + ` h
	WHERE h.key_hash = o.key_hash AND h.id < o.id AND h.holds AND h.key = o.key))`)
	}
	b.WriteString(`
AND (o.key IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.outbox + ` p
	WHERE p.key_hash = o.key_hash AND p.id < o.id AND p.` + strings.ReplaceAll(retrying, " AND ", " AND p.") + `
	AND p.next_attempt_at > now() AND p.key = o.key))
ORDER BY o.id LIMIT ` + strconv.Itoa(q.Limit))
	// The limit is inlined: with "LIMIT $n", a prepared statement's
	// generic plan assumes a large share of the table and may pick a
	// sequential scan and sort over the primary key.
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// PendingReadSetup turns JIT compilation off for reads of a backlog.
//
// The planner has no statistics for key_hash % Partitions and guesses
// that few rows match, so the read's estimated cost passes
// jit_above_cost once the outbox holds tens of thousands of rows.
// PostgreSQL then compiles the plan with LLVM on every execution: 30–175
// ms per read of 2,000 rows that takes 1–3 ms to run, which cut three
// forwarders draining 200,000 rows from about 55,000 msg/s to 17,000.
// SET LOCAL confines the setting to the read's transaction.
func (d *sqlDialect) PendingReadSetup() []sqladapters.Query {
	return []sqladapters.Query{{SQL: `SET LOCAL jit = off`}}
}

// CompleteForwarded deletes published rows, or moves them to the kept
// table, in one statement.
func (d *sqlDialect) CompleteForwarded(ids []int64, keep bool) []sqladapters.Query {
	if keep {
		return []sqladapters.Query{{SQL: d.keepSQL(`$1::bigint[]`), Args: []any{idArray(ids)}}}
	}
	return []sqladapters.Query{{
		SQL:  `DELETE FROM ` + d.outbox + ` WHERE id = ANY($1::bigint[])`,
		Args: []any{idArray(ids)},
	}}
}

// keepSQL moves the outbox rows with the ids of the array expression ids
// to the kept table, selecting nothing.
func (d *sqlDialect) keepSQL(ids string) string {
	return `WITH m AS (DELETE FROM ` + d.outbox + ` WHERE id = ANY(` + ids + `) RETURNING ` + messageColumns + `)
INSERT INTO ` + d.kept + ` (` + messageColumns + `) SELECT * FROM m`
}

// idArray renders ids as an array literal into one buffer, without a
// string per id: the forwarder passes thousands with every read and delete.
func idArray(ids []int64) string {
	b := make([]byte, 0, 2+len(ids)*8)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	b = append(b, '}')
	return string(b)
}

// RecordFailure stores the attempt count, error and its fingerprint, and
// the next attempt time; a dead row moves to the dead letters' table in
// one statement, holding its key with f.Hold. Only a dead letter that
// holds its key names the holds column, so that forwarders without
// Config.DeadLetterHoldsKey record failures on a schema before version 6
// too, as during an upgrade.
func (d *sqlDialect) RecordFailure(f sqladapters.Failure) []sqladapters.Query {
	fp := sqladapters.FingerprintError(f.Error)
	if f.Dead && f.Hold {
		return []sqladapters.Query{{
			SQL: `WITH m AS (DELETE FROM ` + d.outbox + ` WHERE id = $1 RETURNING ` + messageColumns + `)
INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp, holds)
SELECT m.*, $2, $3, $4::bytea, coalesce(m.key, '') <> '' FROM m`,
			Args: []any{f.ID, f.Attempts, f.Error, fp[:]},
		}}
	}
	if f.Dead {
		return []sqladapters.Query{{
			SQL: `WITH m AS (DELETE FROM ` + d.outbox + ` WHERE id = $1 RETURNING ` + messageColumns + `)
INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp)
SELECT m.*, $2, $3, $4::bytea FROM m`,
			Args: []any{f.ID, f.Attempts, f.Error, fp[:]},
		}}
	}
	return []sqladapters.Query{{
		SQL: `UPDATE ` + d.outbox + ` SET attempts = $2, last_error = $3, error_fp = $5::bytea,
	next_attempt_at = now() + $4 * interval '1 microsecond'
WHERE id = $1`,
		Args: []any{f.ID, f.Attempts, f.Error, micros(f.Backoff), fp[:]},
	}}
}

// RequeueDeadLetters moves dead letters back into the outbox under their
// ids, in one statement. Their last error and its fingerprint go along.
// A requeued row is due since its creation: a read whose clock started
// before the requeue committed, yet sees it, must find it due, for it
// has a lower id than the rows of its key that its dead letter held,
// and only a row waiting for a retry holds them back otherwise.
func (d *sqlDialect) RequeueDeadLetters(ids []int64) []sqladapters.Query {
	return []sqladapters.Query{{
		SQL: `WITH m AS (DELETE FROM ` + d.dead + ` WHERE id = ANY($1::bigint[]) RETURNING ` + messageColumns + `, last_error, error_fp)
INSERT INTO ` + d.outbox + ` (` + messageColumns + `, last_error, error_fp, requeued_at, next_attempt_at) OVERRIDING SYSTEM VALUE
SELECT m.*, now(), m.created_at FROM m`,
		Args: []any{int64Array(ids)},
	}}
}

// EnsurePartitions creates the missing lease rows.
func (d *sqlDialect) EnsurePartitions(n int) []sqladapters.Query {
	return []sqladapters.Query{{
		SQL:  `INSERT INTO ` + d.leases + ` (partition) SELECT generate_series(0, $1::int - 1) ON CONFLICT DO NOTHING`,
		Args: []any{n},
	}}
}

// CountPartitions counts the lease rows.
func (d *sqlDialect) CountPartitions() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.leases}
}

// Heartbeat upserts the member row of instance.
func (d *sqlDialect) Heartbeat(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at) VALUES ($1, now() + $2 * interval '1 microsecond')
ON CONFLICT (instance) DO UPDATE SET expires_at = EXCLUDED.expires_at`,
		Args: []any{instance, micros(ttl)},
	}
}

// HeartbeatSettings upserts the member row of instance with its settings.
func (d *sqlDialect) HeartbeatSettings(instance string, ttl time.Duration, settings string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at, settings) VALUES ($1, now() + $2 * interval '1 microsecond', $3)
ON CONFLICT (instance) DO UPDATE SET expires_at = EXCLUDED.expires_at, settings = EXCLUDED.settings`,
		Args: []any{instance, micros(ttl), settings},
	}
}

// MemberSettings selects the settings of the other live instances.
func (d *sqlDialect) MemberSettings(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT instance, settings FROM ` + d.members + ` WHERE expires_at > now() AND instance <> $1 ORDER BY instance`,
		Args: []any{instance},
	}
}

// CountMembers counts live instances.
func (d *sqlDialect) CountMembers() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.members + ` WHERE expires_at > now()`}
}

// RemoveMember deletes instance and expired members.
func (d *sqlDialect) RemoveMember(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.members + ` WHERE instance = $1 OR expires_at <= now()`,
		Args: []any{instance},
	}
}

// ClaimPartitions leases free or expired partitions, lowest first.
func (d *sqlDialect) ClaimPartitions(instance string, ttl time.Duration, max int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `UPDATE ` + d.leases + ` SET owner = $1, expires_at = now() + $2 * interval '1 microsecond'
WHERE partition IN (
	SELECT partition FROM ` + d.leases + `
	WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= now()
	ORDER BY partition LIMIT $3 FOR UPDATE SKIP LOCKED)`,
		Args: []any{instance, micros(ttl), max},
	}
}

// RenewPartitions extends the unexpired leases of instance.
func (d *sqlDialect) RenewPartitions(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET expires_at = now() + $2 * interval '1 microsecond' WHERE owner = $1 AND expires_at > now()`,
		Args: []any{instance, micros(ttl)},
	}
}

// OwnedPartitions selects the partitions instance holds.
func (d *sqlDialect) OwnedPartitions(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT partition FROM ` + d.leases + ` WHERE owner = $1 AND expires_at > now() ORDER BY partition`,
		Args: []any{instance},
	}
}

// ReleasePartitions frees partitions of instance.
func (d *sqlDialect) ReleasePartitions(instance string, partitions []int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET owner = NULL, expires_at = NULL WHERE owner = $1 AND partition = ANY($2::int[])`,
		Args: []any{instance, intArray(partitions)},
	}
}

// SelectPendingWithAge is SelectPending with a ninth column: each row's
// age in microseconds by the database's clock, from which the forwarder
// measures commit-to-acknowledgement latency without trusting the
// application's clock.
func (d *sqlDialect) SelectPendingWithAge(q sqladapters.PendingQuery) (sqladapters.Query, bool) {
	s := d.SelectPending(q)
	s.SQL = strings.Replace(s.SQL, rowColumns+` FROM`, rowColumns+`, `+ageMicros(`o.created_at`)+` FROM`, 1)
	return s, true
}

// PendingHorizon returns the sequence position, the statement snapshot's
// xmin, the transaction id the statement takes (pg_current_xact_id gives
// its autocommit transaction one; it commits without waiting for a disk
// flush, as it writes nothing else), the lowest id waiting for a retry,
// through retry_idx, which holds only such rows, the lowest id of a dead
// letter holding its key, through the hold index, which holds only those,
// and how many ids the
// sequence hands each session at once (its CACHE).
func (d *sqlDialect) PendingHorizon() (sqladapters.Query, bool) {
	return sqladapters.Query{
		SQL: `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'id')), 0),
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint,
	pg_current_xact_id()::text::bigint,
	coalesce((SELECT min(id) FROM ` + d.outbox + ` WHERE ` + retrying + `), 0),
	coalesce((SELECT min(id) FROM ` + d.dead + ` WHERE holds), 0),
	(SELECT seqcache FROM pg_sequence WHERE seqrelid = pg_get_serial_sequence($1, 'id')::regclass)`,
		Args: []any{d.outbox},
	}, true
}

// HighWaterMark returns the position of the outbox's id sequence: one
// catalog lookup and a read of the sequence, however large or bloated the
// table (max(id) would walk the index over deleted rows).
func (d *sqlDialect) HighWaterMark() (sqladapters.Query, bool) {
	return sqladapters.Query{
		SQL:  `SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'id')), 0)`,
		Args: []any{d.outbox},
	}, true
}
