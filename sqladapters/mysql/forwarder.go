package mysql

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const rowColumns = "o.id, o.topic, o.uuid, o.payload, o.metadata, o.`key`, o.attempts"

// Values of the outbox's generated state column.
const (
	statePending = "0"
	stateDead    = "1"
)

// SelectPending reads due rows in id order through state_idx. A row whose
// key has an earlier row backing off after a failure is left out, so the
// key keeps its order. The backoff check looks up the key's hash in
// retry_idx, which holds only rows waiting for a retry, and then compares
// the keys: rows with equal keys have equal hashes (the hash also places
// the key in its partition).
//
// Both indexes are forced. The optimizer, going by statistics, would
// otherwise scan the whole table for the check of every row (retry_idx
// holds mostly NULLs), or walk the primary key over dead and kept rows.
func (d *sqlDialect) SelectPending(q sqladapters.PendingQuery) sqladapters.Query {
	var b strings.Builder
	b.WriteString(`SELECT ` + rowColumns + ` FROM ` + d.outbox + ` o FORCE INDEX (state_idx)
WHERE o.state = ` + statePending + ` AND o.next_attempt_at <= ` + now)
	if q.Owned != nil {
		if len(q.Owned) == 0 {
			b.WriteString(` AND FALSE`)
		} else {
			b.WriteString(` AND o.key_hash % ` + strconv.Itoa(q.Partitions) + ` IN (` + intList(q.Owned) + `)`)
		}
	}
	if len(q.Exclude) > 0 {
		b.WriteString(` AND o.id NOT IN (` + intList(q.Exclude) + `)`)
	}
	if q.After > 0 {
		b.WriteString(` AND o.id > ` + strconv.FormatInt(q.After, 10))
	}
	b.WriteString(`
AND (o.` + "`key`" + ` IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.outbox + ` p FORCE INDEX (retry_idx)
	WHERE p.retry_hash = o.key_hash AND p.next_attempt_at > ` + now + ` AND p.id < o.id
	AND p.` + "`key`" + ` = o.` + "`key`" + `))
ORDER BY o.id LIMIT ?`)
	return sqladapters.Query{SQL: b.String(), Args: []any{q.Limit}}
}

// CompleteForwarded deletes published rows, or stamps published_at.
func (d *sqlDialect) CompleteForwarded(ids []int64, keep bool) sqladapters.Query {
	where := ` WHERE ` + idIn("id", ids)
	if keep {
		return sqladapters.Query{SQL: `UPDATE ` + d.outbox + ` SET published_at = ` + now + where}
	}
	return sqladapters.Query{SQL: `DELETE FROM ` + d.outbox + where}
}

// idIn renders "col IN (ids)", or FALSE for no ids (MySQL refuses "IN ()").
func idIn[T int | int64](col string, ids []T) string {
	if len(ids) == 0 {
		return `FALSE`
	}
	return col + ` IN (` + intList(ids) + `)`
}

// RecordFailure stores the attempt count, error and next attempt time.
func (d *sqlDialect) RecordFailure(f sqladapters.Failure) sqladapters.Query {
	dead := `NULL`
	if f.Dead {
		dead = now
	}
	return sqladapters.Query{
		SQL: `UPDATE ` + d.outbox + ` SET attempts = ?, last_error = ?, next_attempt_at = ` + nowPlus + `, dead_at = ` + dead + `
WHERE id = ?`,
		Args: []any{f.Attempts, cleanText(f.Error, maxErrorBytes), micros(f.Backoff), f.ID},
	}
}

// cleanText makes s storable in a utf8mb4 TEXT column under strict mode:
// valid UTF-8, at most limit bytes, cut at a character boundary.
func cleanText(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut]
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// ListDeadLetters pages through dead rows.
func (d *sqlDialect) ListDeadLetters(afterID int64, limit int) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT ` + rowColumns + `, COALESCE(o.last_error, ''), o.created_at, o.dead_at FROM ` + d.outbox + ` o
WHERE o.state = ` + stateDead + ` AND o.id > ? ORDER BY o.id LIMIT ?`,
		Args: []any{afterID, limit},
	}
}

// RequeueDeadLetters makes dead rows pending again. Their last error stays
// until they are published.
func (d *sqlDialect) RequeueDeadLetters(ids []int64) sqladapters.Query {
	q := `UPDATE ` + d.outbox + ` SET dead_at = NULL, attempts = 0, next_attempt_at = ` + now + ` WHERE state = ` + stateDead
	if ids == nil {
		return sqladapters.Query{SQL: q}
	}
	return sqladapters.Query{SQL: q + ` AND ` + idIn("id", ids)}
}

// partitionsPerInsert bounds the VALUES list of one EnsurePartitions
// statement.
const partitionsPerInsert = 1000

// EnsurePartitions creates the missing lease rows. INSERT IGNORE is safe
// here: the only value is an integer that cannot be truncated, so the only
// error it ignores is the duplicate key it is meant to ignore.
func (d *sqlDialect) EnsurePartitions(n int) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < n; start += partitionsPerInsert {
		var b strings.Builder
		b.WriteString(`INSERT IGNORE INTO ` + d.leases + " (`partition`) VALUES ")
		for p := start; p < min(start+partitionsPerInsert, n); p++ {
			if p > start {
				b.WriteByte(',')
			}
			b.WriteByte('(')
			b.WriteString(strconv.Itoa(p))
			b.WriteByte(')')
		}
		qs = append(qs, sqladapters.Query{SQL: b.String()})
	}
	return qs
}

// CountPartitions counts the lease rows.
func (d *sqlDialect) CountPartitions() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT COUNT(*) FROM ` + d.leases}
}

// Heartbeat upserts the member row of instance. The new expiry is spelled
// out twice rather than through VALUES(), which MySQL 8 deprecates, or a
// row alias, which MariaDB lacks.
func (d *sqlDialect) Heartbeat(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at) VALUES (?, ` + nowPlus + `)
ON DUPLICATE KEY UPDATE expires_at = ` + nowPlus,
		Args: []any{fitKey(instance, maxOwnerBytes), micros(ttl), micros(ttl)},
	}
}

// CountMembers counts live instances.
func (d *sqlDialect) CountMembers() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT COUNT(*) FROM ` + d.members + ` WHERE expires_at > ` + now}
}

// RemoveMember deletes instance and expired members.
func (d *sqlDialect) RemoveMember(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `DELETE FROM ` + d.members + ` WHERE instance = ? OR expires_at <= ` + now,
		Args: []any{fitKey(instance, maxOwnerBytes)},
	}
}

// ClaimPartitions leases free or expired partitions, lowest first.
//
// MySQL has no UPDATE ... RETURNING; the claim writes the owner and expiry
// into the lease rows (UPDATE ... ORDER BY ... LIMIT), and OwnedPartitions
// reads back what this instance got. Concurrent claimers cannot both take a
// row: the UPDATE re-reads each row it locks and skips one whose new owner
// already has an unexpired lease. Without SKIP LOCKED a claimer waits for
// rows another claimer holds, which lasts one short statement.
//
// With Options.SkipLocked it picks its rows with SELECT ... FOR UPDATE SKIP
// LOCKED in a derived table and never waits. The derived table is
// materialized (it has a LIMIT), which lets MySQL read the table it
// updates, and STRAIGHT_JOIN with the primary key makes the UPDATE visit
// only the picked rows: a scan of the table would lock, and wait for,
// every row.
func (d *sqlDialect) ClaimPartitions(instance string, ttl time.Duration, max int) sqladapters.Query {
	const part = "`partition`"
	free := `owner IS NULL OR expires_at IS NULL OR expires_at <= ` + now
	if d.opts.SkipLocked {
		return sqladapters.Query{
			SQL: `UPDATE (SELECT ` + part + ` AS p FROM ` + d.leases + ` WHERE ` + free + `
	ORDER BY ` + part + ` LIMIT ? FOR UPDATE SKIP LOCKED) c
STRAIGHT_JOIN ` + d.leases + ` l FORCE INDEX (PRIMARY) ON l.` + part + ` = c.p
SET l.owner = ?, l.expires_at = ` + nowPlus,
			Args: []any{max, fitKey(instance, maxOwnerBytes), micros(ttl)},
		}
	}
	return sqladapters.Query{
		SQL: `UPDATE ` + d.leases + ` SET owner = ?, expires_at = ` + nowPlus + `
WHERE ` + free + ` ORDER BY ` + part + ` LIMIT ?`,
		Args: []any{fitKey(instance, maxOwnerBytes), micros(ttl), max},
	}
}

// RenewPartitions extends the unexpired leases of instance.
func (d *sqlDialect) RenewPartitions(instance string, ttl time.Duration) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET expires_at = ` + nowPlus + ` WHERE owner = ? AND expires_at > ` + now,
		Args: []any{micros(ttl), fitKey(instance, maxOwnerBytes)},
	}
}

// OwnedPartitions selects the partitions instance holds.
func (d *sqlDialect) OwnedPartitions(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  "SELECT `partition` FROM " + d.leases + " WHERE owner = ? AND expires_at > " + now + " ORDER BY `partition`",
		Args: []any{fitKey(instance, maxOwnerBytes)},
	}
}

// ReleasePartitions frees partitions of instance.
func (d *sqlDialect) ReleasePartitions(instance string, partitions []int) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `UPDATE ` + d.leases + ` SET owner = NULL, expires_at = NULL WHERE owner = ? AND ` + idIn("`partition`", partitions),
		Args: []any{fitKey(instance, maxOwnerBytes)},
	}
}

// CountOutbox counts pending and dead rows.
func (d *sqlDialect) CountOutbox() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT
	(SELECT count(*) FROM ` + d.outbox + ` WHERE state = ` + statePending + `),
	(SELECT count(*) FROM ` + d.outbox + ` WHERE state = ` + stateDead + `)`}
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

// HighWaterMark returns the largest id in the outbox: InnoDB reads the
// primary key's last leaf.
func (d *sqlDialect) HighWaterMark() sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT COALESCE(MAX(id), 0) FROM ` + d.outbox}
}
