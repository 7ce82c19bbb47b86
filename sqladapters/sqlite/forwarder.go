package sqlite

import (
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const rowColumns = `o.id, o.topic, o.uuid, o.payload, o.metadata, o.key, o.attempts`

// SelectPending reads due rows in id order. A row whose key has an earlier
// row backing off after a failure is left out, so the key keeps its order.
// The backoff check looks the key's hash up in the retry index, which holds
// only rows waiting for a retry, and then compares the full keys: the index
// stays small whatever the keys' length, and a key sharing another's hash
// is not held back.
// Lists of partitions and ids travel as one JSON array each (json_each), so
// the SQL text depends only on which filters are set.
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
WHERE o.dead_at IS NULL AND o.published_at IS NULL AND o.next_attempt_at <= ?`)
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
	b.WriteString(`
AND (o.key IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.outbox + ` p
	WHERE p.key_hash = o.key_hash AND p.id < o.id AND p.attempts > 0
	AND p.dead_at IS NULL AND p.published_at IS NULL AND p.next_attempt_at > ?
	AND p.key = o.key))
ORDER BY o.id LIMIT ?`)
	args = append(args, at, q.Limit)
	return sqladapters.Query{SQL: b.String(), Args: args}
}

// CompleteForwarded deletes published rows, or stamps published_at.
func (d *sqlDialect) CompleteForwarded(ids []int64, keep bool) sqladapters.Query {
	if keep {
		return sqladapters.Query{
			SQL:  `UPDATE ` + d.outbox + ` SET published_at = ` + now + ` WHERE id IN (SELECT value FROM json_each(?))`,
			Args: []any{idList(ids)},
		}
	}
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.outbox + ` WHERE id IN (SELECT value FROM json_each(?))`,
		Args: []any{idList(ids)},
	}
}

// RecordFailure stores the attempt count, error and next attempt time.
func (d *sqlDialect) RecordFailure(f sqladapters.Failure) sqladapters.Query {
	return sqladapters.Query{
		SQL: `UPDATE ` + d.outbox + ` SET attempts = ?, last_error = ?,
	next_attempt_at = ` + nowPlus + `,
	dead_at = CASE WHEN ? THEN ` + now + ` END
WHERE id = ?`,
		Args: []any{f.Attempts, f.Error, offset(f.Backoff), f.Dead, f.ID},
	}
}

// ListDeadLetters pages through dead rows. created_at and dead_at are
// selected as bare columns, so drivers see their declared TIMESTAMP type.
func (d *sqlDialect) ListDeadLetters(afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT ` + rowColumns + `, coalesce(o.last_error, ''), o.created_at, o.dead_at FROM ` + d.outbox + ` o
WHERE o.dead_at IS NOT NULL AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: []any{afterID, limit},
	}
}

// RequeueDeadLetters makes dead rows pending again.
func (d *sqlDialect) RequeueDeadLetters(ids []int64) sqladapters.Query {
	q := `UPDATE ` + d.outbox + ` SET dead_at = NULL, attempts = 0, next_attempt_at = ` + now + ` WHERE dead_at IS NOT NULL`
	if ids == nil {
		return sqladapters.Query{SQL: q}
	}
	return sqladapters.Query{SQL: q + ` AND id IN (SELECT value FROM json_each(?))`, Args: []any{idList(ids)}}
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

// CountOutbox counts pending and dead rows.
func (d *sqlDialect) CountOutbox() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NULL AND published_at IS NULL),
	(SELECT count(*) FROM ` + d.outbox + ` WHERE dead_at IS NOT NULL)`}
}

// SelectPendingWithAge is SelectPending with an eighth column: each row's
// age in microseconds by the database's clock, from which the forwarder
// measures commit-to-acknowledgement latency without trusting the
// application's clock.
func (d *sqlDialect) SelectPendingWithAge(q sqladapters.PendingQuery) sqladapters.Query {
	s := d.SelectPending(q)
	s.SQL = strings.Replace(s.SQL, rowColumns+` FROM`, rowColumns+`, `+ageMicros(`o.created_at`)+` FROM`, 1)
	return s
}

// HighWaterMark returns the largest id in the outbox: the rightmost entry
// of the table's b-tree.
func (d *sqlDialect) HighWaterMark() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT coalesce(max(id), 0) FROM ` + d.outbox}
}

// timeFormat is the text form of now: strftime('%Y-%m-%dT%H:%M:%fZ').
const timeFormat = "2006-01-02T15:04:05.000Z"
