package mysql

import (
	"strconv"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

const rowColumns = "o.id, o.topic, o.uuid, o.payload, o.metadata, o.`key`, o.attempts, o.key_hash"

// Values of the outbox's generated state column, which rows had before
// version 5 moved dead and kept rows to tables of their own.
const (
	stateDead      = "1"
	statePublished = "2"
)

// SelectPending reads due rows in id order through the primary key: the
// outbox holds only rows that still have to go, so the read walks no dead
// or kept row. A row whose key has an earlier row backing off after a
// failure is left out, so the key keeps its order. The backoff check looks
// the key's hash up in the retry markers, which hold only rows waiting for
// a retry, and then compares the keys of the outbox rows they mark: rows
// with equal keys have equal hashes (the hash also places the key in its
// partition), and a marker whose row is gone marks nothing.
//
// With q.DeadLetterHolds, a row whose key has an earlier dead letter
// holding it is left out too, through the dead letters' hold_idx, whose
// entries of dead letters that hold nothing sort apart from those that
// do.
//
// The primary keys are forced: the optimizer, going by statistics, may
// otherwise sort the outbox instead of reading it in id order, or scan the
// markers, whose table is empty most of the time, for every row.
func (d *sqlDialect) SelectPending(q sqladapters.PendingQuery) sqladapters.Query {
	var b strings.Builder
	b.WriteString(`SELECT ` + rowColumns + ` FROM ` + d.outbox + ` o FORCE INDEX (PRIMARY)
WHERE o.next_attempt_at <= ` + now)
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
	var args []any
	if len(q.SkipKeys) > 0 {
		b.WriteString(` AND (o.` + "`key`" + ` IS NULL OR o.` + "`key`" + ` NOT IN (?` + strings.Repeat(`, ?`, len(q.SkipKeys)-1) + `))`)
		for _, k := range q.SkipKeys {
			args = append(args, k)
		}
	}
	if q.DeadLetterHolds {
		b.WriteString(`
AND (o.` + "`key`" + ` IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.dead + ` h FORCE INDEX (hold_idx)
	WHERE h.holds = 1 AND h.key_hash = o.key_hash AND h.id < o.id AND h.` + "`key`" + ` = o.` + "`key`" + `))`)
	}
	b.WriteString(`
AND (o.` + "`key`" + ` IS NULL OR NOT EXISTS (
	SELECT 1 FROM ` + d.retries + ` r FORCE INDEX (PRIMARY) JOIN ` + d.outbox + ` p ON p.id = r.id
	WHERE r.key_hash = o.key_hash AND r.id < o.id AND r.next_attempt_at > ` + now + `
	AND p.` + "`key`" + ` = o.` + "`key`" + `))
ORDER BY o.id LIMIT ?`)
	return sqladapters.Query{SQL: b.String(), Args: append(args, q.Limit)}
}

// CompleteForwarded deletes published rows, or moves them to the kept
// table: an insert of copies, then the delete, in one transaction.
func (d *sqlDialect) CompleteForwarded(ids []int64, keep bool) []sqladapters.Query {
	del := sqladapters.Query{SQL: `DELETE FROM ` + d.outbox + ` WHERE ` + idIn("id", ids)}
	if !keep {
		return []sqladapters.Query{del}
	}
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + d.kept + ` (` + messageColumns + `, published_at)
SELECT ` + messageColumns + `, ` + now + ` FROM ` + d.outbox + ` WHERE ` + idIn("id", ids),
	}, del}
}

// idIn renders "col IN (ids)", or FALSE for no ids (MySQL refuses "IN ()").
func idIn[T int | int64](col string, ids []T) string {
	if len(ids) == 0 {
		return `FALSE`
	}
	return col + ` IN (` + intList(ids) + `)`
}

// RecordFailure stores the attempt count, error and next attempt time,
// and marks a keyed row as waiting for a retry; a dead row moves to the
// dead letters' table, holding its key with f.Hold. Either way the key hash's markers of this row and
// of retries already due go: a marker outlives its row only when the row
// was published while it waited (a call past PublishTimeout that
// delivered after all), and then until its key fails again.
func (d *sqlDialect) RecordFailure(f sqladapters.Failure) []sqladapters.Query {
	text := cleanText(f.Error, maxErrorBytes)
	fp := sqladapters.FingerprintError(text)
	unmark := sqladapters.Query{
		SQL: `DELETE FROM ` + d.retries + ` WHERE key_hash = (SELECT key_hash FROM ` + d.outbox + ` WHERE id = ?)
AND (id = ? OR next_attempt_at <= ` + now + `)`,
		Args: []any{f.ID, f.ID},
	}
	if f.Dead {
		return []sqladapters.Query{{
			SQL: `INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp, dead_at` + holdsColumn(f) + `)
SELECT ` + messageColumns + `, ?, ?, ?, ` + now + holdsValue(f) + ` FROM ` + d.outbox + ` WHERE id = ?`,
			Args: []any{f.Attempts, text, fp[:], f.ID},
		}, unmark, {
			SQL:  `DELETE FROM ` + d.outbox + ` WHERE id = ?`,
			Args: []any{f.ID},
		}}
	}
	return []sqladapters.Query{{
		SQL: `UPDATE ` + d.outbox + ` SET attempts = ?, last_error = ?, error_fp = ?, next_attempt_at = ` + nowPlus + `
WHERE id = ?`,
		Args: []any{f.Attempts, text, fp[:], micros(f.Backoff), f.ID},
	}, unmark, {
		SQL: `INSERT INTO ` + d.retries + ` (key_hash, id, next_attempt_at)
SELECT key_hash, id, next_attempt_at FROM ` + d.outbox + " WHERE id = ? AND `key` IS NOT NULL",
		Args: []any{f.ID},
	}}
}

// holdsColumn and holdsValue add the holds column to a dead letter's
// insert when it holds its key, true for a row with a key. Only then:
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
		return ", COALESCE(`key`, '') <> ''"
	}
	return ``
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

// RequeueDeadLetters moves dead letters back into the outbox under their
// ids: an insert of copies, then the delete, in one transaction. Their
// last error and its fingerprint go along. A requeued row is due since its
// creation: a read whose clock started before the requeue committed, yet
// sees it, must find it due, for it has a lower id than the rows of its
// key that its dead letter held, and only a row waiting for a retry holds
// them back otherwise.
func (d *sqlDialect) RequeueDeadLetters(ids []int64) []sqladapters.Query {
	return []sqladapters.Query{{
		SQL: `INSERT INTO ` + d.outbox + ` (` + messageColumns + `, next_attempt_at, last_error, error_fp, requeued_at)
SELECT ` + messageColumns + `, created_at, last_error, error_fp, ` + now + ` FROM ` + d.dead + ` WHERE ` + idIn("id", ids),
	}, {
		SQL: `DELETE FROM ` + d.dead + ` WHERE ` + idIn("id", ids),
	}}
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

// HeartbeatSettings upserts the member row of instance with its settings.
func (d *sqlDialect) HeartbeatSettings(instance string, ttl time.Duration, settings string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `INSERT INTO ` + d.members + ` (instance, expires_at, settings) VALUES (?, ` + nowPlus + `, ?)
ON DUPLICATE KEY UPDATE expires_at = ` + nowPlus + `, settings = ?`,
		Args: []any{fitKey(instance, maxOwnerBytes), micros(ttl), settings, micros(ttl), settings},
	}
}

// MemberSettings selects the settings of the other live instances.
func (d *sqlDialect) MemberSettings(instance string) sqladapters.Query {
	return sqladapters.Query{
		SQL:  `SELECT instance, settings FROM ` + d.members + ` WHERE expires_at > ` + now + ` AND instance <> ? ORDER BY instance`,
		Args: []any{fitKey(instance, maxOwnerBytes)},
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

// SelectPendingWithAge is SelectPending with a ninth column: each row's
// age in microseconds by the database's clock, from which the forwarder
// measures commit-to-acknowledgement latency without trusting the
// application's clock.
func (d *sqlDialect) SelectPendingWithAge(q sqladapters.PendingQuery) (sqladapters.Query, bool) {
	s := d.SelectPending(q)
	s.SQL = strings.Replace(s.SQL, rowColumns+` FROM`, rowColumns+`, `+ageMicros(`o.created_at`)+` FROM`, 1)
	return s, true
}

// HighWaterMark returns the largest id in the outbox: InnoDB reads the
// primary key's last leaf.
func (d *sqlDialect) HighWaterMark() (sqladapters.Query, bool) {
	return sqladapters.Query{SQL: `SELECT COALESCE(MAX(id), 0) FROM ` + d.outbox}, true
}
