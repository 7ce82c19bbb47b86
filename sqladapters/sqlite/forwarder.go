package sqlite

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const rowColumns = `o.id, o.topic, o.uuid, o.payload, o.metadata, o.key, o.attempts, o.key_hash`

// retrying is the predicate of the retry index: rows waiting for a
// retry. It names dead_at and published_at, always NULL since version 5,
// because the index was made with them; a statement that reads the index
// must repeat them for the planner to use it.
const retrying = `attempts > 0 AND dead_at IS NULL AND published_at IS NULL`

// SelectPending reads due rows in id order along the table's b-tree: the
// outbox holds only rows that still have to go, so the read walks no dead
// or kept row. A row whose key has an earlier row backing off after a
// failure is left out, so the key keeps its order. The backoff check looks
// the key's hash up in the retry index, which holds only rows waiting for
// a retry, and then compares the full keys: the index stays small whatever
// the keys' length, and a key sharing another's hash is not held back.
// With q.DeadLetterHolds, a row whose key has an earlier dead letter
// holding it is left out the same way, through the dead letters' hold
// index, which holds only those. Lists of partitions and ids travel as one
// JSON array each (json_each), so the SQL text depends only on which
// filters are set.
//
// The current time is a parameter, taken once: SQLite evaluates 'now'
// afresh for each row a statement steps through, so a retry's backoff
// could end between the check of the row itself (not due yet) and that of
// a later row of its key (no longer held back), letting the later row go
// first. SQLite runs in this process, on the same clock.
func (d *sqlDialect) SelectPending(q sqladapters.PendingQuery) sqladapters.Query {
	var b strings.Builder
	at := time.Now().UTC().Format(timeFormat)
	args := []any{at}
	b.WriteString(`SELECT ` + rowColumns + ` FROM ` + d.outbox + ` o
WHERE o.next_attempt_at <= ?`)
	if q.Owned != nil {
		b.WriteString(` AND o.key_hash % ? IN (SELECT value FROM json_each(?))`)
		args = append(args, q.Partitions, idList(q.Owned))
	}
	if len(q.Exclude) > 0 {
		b.WriteString(` AND o.id NOT IN (SELECT value FROM json_each(?))`)
		args = append(args, idList(q.Exclude))
	}
	if q.After > 0 {
		b.WriteString(` AND o.id > ?`)
		args = append(args, q.After)
	}
	if len(q.SkipKeys) > 0 {
		b.WriteString(` AND (o.key IS NULL OR o.key NOT IN (SELECT value FROM json_each(?)))`)
		keys, _ := json.Marshal(q.SkipKeys)
		args = append(args, string(keys))
	}
	if q.DeadLetterHolds {
		b.WriteString(`
AND (o.key IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.dead + ` h
	WHERE h.key_hash = o.key_hash AND h.id < o.id AND h.holds = 1 AND h.key = o.key))`)
	}
	b.WriteString(`
AND (o.key IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.outbox + ` p
	WHERE p.key_hash = o.key_hash AND p.id < o.id AND p.` + strings.ReplaceAll(retrying, " AND ", " AND p.") + `
	AND p.next_attempt_at > ? AND p.key = o.key))
ORDER BY o.id LIMIT ?`)
	args = append(args, at, q.Limit)
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// CompleteForwarded deletes published rows, or moves them to the kept
// table: an insert of copies, then the delete, in one transaction.
func (d *sqlDialect) CompleteForwarded(ids []int64, keep bool) []sqladapters.Query {
	del := sqladapters.Query{
		SQL:  `DELETE FROM ` + d.outbox + ` WHERE id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}
	if !keep {
		return []sqladapters.Query{del}
	}
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + d.kept + ` (` + messageColumns + `)
SELECT ` + messageColumns + ` FROM ` + d.outbox + ` WHERE id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}, del}
}

// RecordFailure stores the attempt count, error and its fingerprint, and
// the next attempt time; a dead row moves to the dead letters' table,
// holding its key with f.Hold.
func (d *sqlDialect) RecordFailure(f sqladapters.Failure) []sqladapters.Query {
	fp := sqladapters.FingerprintError(f.Error)
	if f.Dead {
		return []sqladapters.Query{{
			SQL: `INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp` + holdsColumn(f) + `)
SELECT ` + messageColumns + `, ?, ?, ?` + holdsValue(f) + ` FROM ` + d.outbox + ` WHERE id = ?`,
			Args: []any{f.Attempts, f.Error, fp[:], f.ID},
		}, {
			SQL:  `DELETE FROM ` + d.outbox + ` WHERE id = ?`,
			Args: []any{f.ID},
		}}
	}
	return []sqladapters.Query{{
		SQL: `UPDATE ` + d.outbox + ` SET attempts = ?, last_error = ?, error_fp = ?,
	next_attempt_at = ` + nowPlus + `
WHERE id = ?`,
		Args: []any{f.Attempts, f.Error, fp[:], offset(f.Backoff), f.ID},
	}}
}

// holdsColumn and holdsValue add the holds column to a dead letter's
// insert when it holds its key, 1 for a row with a key. Only then:
// forwarders without Config.DeadLetterHoldsKey record failures on a
// schema before version 6 too, as during an upgrade.
func holdsColumn(f sqladapters.Failure) string {
	if f.Hold {
		return `, holds`
	}
	return ``
}

func holdsValue(f sqladapters.Failure) string {
	if f.Hold {
		return `, coalesce(key, '') <> ''`
	}
	return ``
}

// RequeueDeadLetters moves dead letters back into the outbox under their
// ids: an insert of copies, then the delete, in one transaction. Their
// last error and its fingerprint go along. A requeued row is due since its
// creation: a read whose clock started before the requeue committed, yet
// sees it, must find it due, for it has a lower id than the rows of its
// key that its dead letter held, and only a row waiting for a retry holds
// them back otherwise.
func (d *sqlDialect) RequeueDeadLetters(ids []int64) []sqladapters.Query {
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + d.outbox + ` (` + messageColumns + `, last_error, error_fp, requeued_at, next_attempt_at)
SELECT ` + messageColumns + `, last_error, error_fp, ` + now + `, created_at FROM ` + d.dead + ` WHERE id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}, {
		SQL:  `DELETE FROM ` + d.dead + ` WHERE id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}}
}

// EnsurePartitions creates the missing lease rows.
func (d *sqlDialect) EnsurePartitions(n int) []sqladapters.Query {
	// "WHERE true" tells SQLite's parser that ON CONFLICT starts the
	// upsert, not a join constraint.
	return []sqladapters.Query{{
		SQL: `WITH RECURSIVE p(n) AS (SELECT 0 WHERE ? > 0 UNION ALL SELECT n + 1 FROM p WHERE n + 1 < ?)
INSERT INTO ` + d.leases + ` (partition) SELECT n FROM p WHERE true ON CONFLICT DO NOTHING`,
		Args: []any{n, n},
	}}
}

// CountPartitions counts the lease rows.
func (d *sqlDialect) CountPartitions() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.leases}
}

// Heartbeat upserts the member row of instance.
func (d *sqlDialect) Heartbeat(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at) VALUES (?, ` + nowPlus + `)
ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at`,
		Args: []any{instance, offset(ttl)},
	}
}

// HeartbeatSettings upserts the member row of instance with its settings.
func (d *sqlDialect) HeartbeatSettings(instance string, ttl time.Duration, settings string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at, settings) VALUES (?, ` + nowPlus + `, ?)
ON CONFLICT (instance) DO UPDATE SET expires_at = excluded.expires_at, settings = excluded.settings`,
		Args: []any{instance, offset(ttl), settings},
	}
}

// MemberSettings selects the settings of the other live instances.
func (d *sqlDialect) MemberSettings(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT instance, settings FROM ` + d.members + ` WHERE expires_at > ` + now + ` AND instance <> ? ORDER BY instance`,
		Args: []any{instance},
	}
}

// CountMembers counts live instances.
func (d *sqlDialect) CountMembers() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT count(*) FROM ` + d.members + ` WHERE expires_at > ` + now}
}

// RemoveMember deletes instance and expired members.
func (d *sqlDialect) RemoveMember(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.members + ` WHERE instance = ? OR expires_at <= ` + now,
		Args: []any{instance},
	}
}

// ClaimPartitions leases free or expired partitions, lowest first. Without
// SKIP LOCKED the claim relies on SQLite's single writer: a write always
// runs on the newest data under the write lock (a transaction whose earlier
// reads are stale gets SQLITE_BUSY instead), so two instances never claim
// the same partition, and the later one claims others or none.
func (d *sqlDialect) ClaimPartitions(instance string, ttl time.Duration, max int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `UPDATE ` + d.leases + ` SET owner = ?, expires_at = ` + nowPlus + `
WHERE partition IN (
	SELECT partition FROM ` + d.leases + `
	WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= ` + now + `
	ORDER BY partition LIMIT ?)`,
		Args: []any{instance, offset(ttl), max},
	}
}

// RenewPartitions extends the unexpired leases of instance.
func (d *sqlDialect) RenewPartitions(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET expires_at = ` + nowPlus + ` WHERE owner = ? AND expires_at > ` + now,
		Args: []any{offset(ttl), instance},
	}
}

// OwnedPartitions selects the partitions instance holds.
func (d *sqlDialect) OwnedPartitions(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT partition FROM ` + d.leases + ` WHERE owner = ? AND expires_at > ` + now + ` ORDER BY partition`,
		Args: []any{instance},
	}
}

// ReleasePartitions frees partitions of instance.
func (d *sqlDialect) ReleasePartitions(instance string, partitions []int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET owner = NULL, expires_at = NULL WHERE owner = ? AND partition IN (SELECT value FROM json_each(?))`,
		Args: []any{instance, idList(partitions)},
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

// HighWaterMark returns the largest id in the outbox: the rightmost entry
// of the table's b-tree.
func (d *sqlDialect) HighWaterMark() (sqladapters.Query, bool) {
	return sqladapters.Query{SQL: `SELECT coalesce(max(id), 0) FROM ` + d.outbox}, true
}

// timeFormat is the text form of now: strftime('%Y-%m-%dT%H:%M:%fZ').
const timeFormat = "2006-01-02T15:04:05.000Z"
