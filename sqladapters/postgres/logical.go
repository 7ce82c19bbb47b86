package postgres

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// The statements of the change-data-capture source (sqladapters.Logical).
// Publication and slot names are validated identifiers, safe inline.

var _ sqlstore.Logical = (*sqlDialect)(nil)

// emitsSuffix names the sequence counting the calls of publishers without
// a table (migration 9).
const emitsSuffix = "_emits"

// markColumns select the WAL position and the oldest running transaction
// of the statement's snapshot, and the last number drawn from the count
// of calls without a table: 0 when none was, -1 when the count does not
// exist (a schema before migration 9).
func (d *sqlDialect) markColumns() string {
	emits := quoteLiteral(d.emits)
	return `SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::text AS lsn,
	pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
	CASE WHEN to_regclass(` + emits + `) IS NULL THEN -1
		ELSE coalesce(pg_sequence_last_value(to_regclass(` + emits + `)), 0) END AS emits`
}

// LogicalCheck reads what the source needs in one statement. The slot's
// failover column exists from PostgreSQL 17 on: read through its row as
// JSON, it is NULL before. A physical standby is a walsender that streams
// no logical slot.
func (d *sqlDialect) LogicalCheck(publication, slot string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT current_setting('wal_level'), current_user::text,
	coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false),
	coalesce(to_regclass($1)::oid, 0)::bigint,
	EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2),
	EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $3),
	current_setting('server_version_num')::int,
	(SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
	coalesce((SELECT (to_jsonb(s)->>'failover')::boolean FROM pg_replication_slots s WHERE slot_name = $3), false),
	(SELECT count(*) FROM pg_stat_replication r
		WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s WHERE s.active_pid = r.pid AND s.slot_type = 'logical'))::int`,
		Args: []any{d.outbox, publication, slot},
	}
}

// PublicationExists selects whether the publication exists.
func (d *sqlDialect) PublicationExists(publication string) sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)`, Args: []any{publication}}
}

// CreatePublication publishes the outbox's inserts (new rows and
// requeued dead letters); a partitioned outbox is published as its root
// table.
func (d *sqlDialect) CreatePublication(publication string) sqladapters.Query {
	with := `publish = 'insert'`
	if d.opts.Partitioned != nil {
		with += `, publish_via_partition_root = true`
	}
	return sqladapters.Query{SQL: `CREATE PUBLICATION "` + publication + `" FOR TABLE ` + d.outbox + ` WITH (` + with + `)`}
}

// SlotExists selects whether the slot exists.
func (d *sqlDialect) SlotExists(slot string) sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)`, Args: []any{slot}}
}

// CreateSlot creates a logical slot decoded by pgoutput; with failover
// (PostgreSQL 17 and later), a failover slot that standbys synchronize.
func (d *sqlDialect) CreateSlot(slot string, failover bool) sqladapters.Query {
	if failover {
		// slot_name, plugin, temporary, twophase, failover
		return sqladapters.Query{SQL: `SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)`, Args: []any{slot}}
	}
	return sqladapters.Query{SQL: `SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')`, Args: []any{slot}}
}

// DropSlot drops the slot where it exists.
func (d *sqlDialect) DropSlot(slot string) sqladapters.Query {
	return sqladapters.Query{SQL: `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, Args: []any{slot}}
}

// DropPublication drops the publication where it exists.
func (d *sqlDialect) DropPublication(publication string) sqladapters.Query {
	return sqladapters.Query{SQL: `DROP PUBLICATION IF EXISTS "` + publication + `"`}
}

// Slot reads the slot's confirmed position, whether it is active and the
// WAL it retains.
func (d *sqlDialect) Slot(slot string) sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT pg_wal_lsn_diff(confirmed_flush_lsn, '0/0')::text, active,
	pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = $1`,
		Args: []any{slot},
	}
}

// PendingKeys selects the distinct keys of the pending rows, and with
// holds those of the dead letters that hold their keys, through the hold
// index.
func (d *sqlDialect) PendingKeys(holds bool) sqladapters.Query {
	keys := `SELECT DISTINCT key IS NOT NULL AS keyed, coalesce(key, '') AS key FROM ` + d.outbox
	if holds {
		keys += ` UNION SELECT true, key FROM ` + d.dead + ` WHERE holds`
	}
	return sqladapters.Query{SQL: `WITH s AS (` + d.markColumns() + `)
SELECT s.lsn, s.xmin, s.emits, k.keyed, k.key FROM s LEFT JOIN (` + keys + `) k ON true`}
}

// ReadKeys selects the pending rows of the keys in id order, those waiting
// for a retry included, and with holds the dead letters holding those
// keys, through the hold index.
func (d *sqlDialect) ReadKeys(keys []string, unkeyed bool, limit int, holds bool) sqladapters.Query {
	rows := `SELECT id, topic, uuid, payload, metadata, key, attempts, next_attempt_at <= now() AS due,
		greatest(extract(epoch FROM next_attempt_at - now()), 0)::float8 AS wait, ` + ageMicros(`created_at`) + ` AS age, false AS holds
	FROM ` + d.outbox + `
	WHERE key = ANY($1::text[]) OR ($2::boolean AND key IS NULL)`
	if holds {
		rows += `
	UNION ALL SELECT id, topic, uuid, ''::bytea, '{}'::jsonb, key, attempts, false, 0::float8, 0::bigint, true
	FROM ` + d.dead + ` WHERE holds AND key = ANY($1::text[])`
	}
	return sqladapters.Query{
		SQL: `WITH s AS (` + d.markColumns() + `)
SELECT s.lsn, s.xmin, s.emits, o.id, o.topic, o.uuid, o.payload, o.metadata::text, o.key, o.attempts, o.due, o.wait, o.age, o.holds
FROM s LEFT JOIN LATERAL (
	SELECT * FROM (` + rows + `) r
	ORDER BY id LIMIT ` + strconv.Itoa(limit) + `) o ON true`,
		Args: []any{textArray(keys), unkeyed},
	}
}

// CompleteStreamed deletes rows seen in the replication stream (or moves
// them to the kept table), returning the ids it removed next to the
// snapshot's xmin.
func (d *sqlDialect) CompleteStreamed(ids []int64, keep bool) sqladapters.Query {
	change := `c AS (DELETE FROM ` + d.outbox + ` WHERE id = ANY($1::bigint[]) RETURNING id)`
	if keep {
		change = `m AS (DELETE FROM ` + d.outbox + ` WHERE id = ANY($1::bigint[]) RETURNING ` + messageColumns + `),
c AS (INSERT INTO ` + d.kept + ` (` + messageColumns + `) SELECT * FROM m RETURNING id)`
	}
	return sqladapters.Query{
		SQL: `WITH s AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin), ` + change + `
SELECT s.xmin, c.id FROM s LEFT JOIN c ON true`,
		Args: []any{idArray(ids)},
	}
}

// EmitCheck reads whether the server can deliver the outbox's logical
// decoding messages (PostgreSQL 14 or later for pgoutput's messages
// option, wal_level logical), their prefix, which names the outbox by its
// oid (the cast resolves the name as every statement of the dialect does),
// and the outbox's id sequence. Whether a slot exists is EmitRecord's.
func (d *sqlDialect) EmitCheck() sqladapters.Query {
	return sqladapters.Query{
		SQL: `SELECT current_setting('wal_level'), current_setting('server_version_num')::int,
	'` + sqladapters.EmitPrefix + `' || to_regclass($1)::oid::text, pg_get_serial_sequence($1, 'id'), to_regclass($2)::text`,
		Args: []any{d.outbox, d.emits},
	}
}

// emitSlot is true where a logical slot of the database can decode what
// commits from now on: its creation has finished (a slot being created
// has no confirmed position yet, and does not decode transactions already
// running) and it has not lost WAL it needs. The slot is the one named
// by the parameter that follows it, or any when that is ”.
const emitSlot = `EXISTS (SELECT 1 FROM pg_replication_slots
	WHERE slot_type = 'logical' AND database = current_database()
		AND confirmed_flush_lsn IS NOT NULL AND wal_status IS DISTINCT FROM 'lost'
		AND ($%d::text = '' OR slot_name = $%d::text))`

// EmitRecord writes r as a transactional logical decoding message of
// prefix with the ids of its messages appended: drawn from sequence in
// order, each as 8 bytes big-endian (int8send), and, where emits names
// the count of calls, a message of prefix and EmitCountSuffix with a
// number drawn from it; only where emitSlot holds,
// which it reads as it writes, in the caller's transaction: a row when it
// wrote r, none when it did not (and drew no id).
func (d *sqlDialect) EmitRecord(prefix, sequence, emits string, r sqladapters.EmitRecord) sqladapters.Query {
	ids := `(SELECT string_agg(int8send(nextval($3::regclass)), ''::bytea ORDER BY g) FROM generate_series(1, $4::int) g)`
	args := []any{prefix, r.Content, sequence, r.Messages}
	if r.Messages == 1 {
		ids, args = `int8send(nextval($3::regclass))`, args[:3]
	}
	count := ""
	if emits != "" {
		// The call's number, in a message of its own that forwarders of
		// earlier versions, which read only prefix, pass over.
		args = append(args, emits)
		count = fmt.Sprintf(`, pg_logical_emit_message(true, $1::text || '`+sqladapters.EmitCountSuffix+`', int8send(nextval($%d::regclass)))`, len(args))
	}
	args = append(args, r.Slot)
	return sqladapters.Query{
		SQL:  `SELECT pg_logical_emit_message(true, $1::text, $2::bytea || ` + ids + `)` + count + ` WHERE ` + fmt.Sprintf(emitSlot, len(args), len(args)),
		Args: args,
	}
}

// writtenTypes are the casts of a written message's parameters, in the
// order of writeRun's VALUES.
var writtenTypes = [...]string{"::bigint", "::text", "::text", "::bytea", "::jsonb", "::text", "::integer", "::timestamptz", "::integer", "::text", "::bytea", "::bigint"}

// WriteMessages writes ms under their ids, in runs of one table each: the
// outbox (pending or failed rows), the dead letters, the kept rows. A row
// whose id is in the outbox or the dead letters already stays as it is
// there. The last statement selects the transaction's id.
func (d *sqlDialect) WriteMessages(ms []sqladapters.WrittenMessage) []sqladapters.Query {
	var qs []sqladapters.Query
	for start := 0; start < len(ms); {
		table := writtenTable(ms[start])
		end := start + 1
		for end < len(ms) && writtenTable(ms[end]) == table && end-start < rowsPerInsert/2 {
			end++
		}
		qs = append(qs, d.writeRun(table, ms[start:end]))
		start = end
	}
	return append(qs, sqladapters.Query{SQL: `SELECT pg_current_xact_id()::text::bigint % 4294967296`})
}

// Tables of writtenTable.
const (
	writtenOutbox = iota
	writtenDead
	writtenHeld // dead letters that hold their keys
	writtenKept
)

func writtenTable(m sqladapters.WrittenMessage) int {
	switch {
	case m.Kept:
		return writtenKept
	case m.Failure != nil && m.Failure.Dead && m.Failure.Hold:
		return writtenHeld
	case m.Failure != nil && m.Failure.Dead:
		return writtenDead
	}
	return writtenOutbox
}

func (d *sqlDialect) writeRun(table int, ms []sqladapters.WrittenMessage) sqladapters.Query {
	var b strings.Builder
	args := make([]any, 0, len(ms)*len(writtenTypes))
	b.WriteString(`(VALUES `)
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		n := len(args)
		for j, typ := range writtenTypes {
			if j == 0 {
				b.WriteByte('(')
			} else {
				b.WriteByte(',')
			}
			b.WriteString(`$` + strconv.Itoa(n+j+1) + typ)
		}
		b.WriteByte(')')
		var key any
		if m.Key != "" {
			key = m.Key
		}
		var (
			attempts int
			lastErr  any
			fp       any
			backoff  int64
		)
		if f := m.Failure; f != nil {
			efp := sqladapters.FingerprintError(f.Error)
			attempts, lastErr, fp, backoff = f.Attempts, f.Error, efp[:], micros(f.Backoff)
		}
		args = append(args, m.ID, m.Topic, m.UUID, m.Payload, string(m.Metadata), key, m.KeyHash, m.Created, attempts, lastErr, fp, backoff)
	}
	b.WriteString(`) w (id, topic, uuid, payload, metadata, key, key_hash, created_at, attempts, last_error, error_fp, backoff)`)
	values := b.String()
	var q string
	switch table {
	case writtenDead:
		q = `INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp)
SELECT id, topic, uuid, payload, metadata, key, key_hash, created_at, attempts, last_error, error_fp FROM ` + values + `
ON CONFLICT DO NOTHING`
	case writtenHeld:
		q = `INSERT INTO ` + d.dead + ` (` + messageColumns + `, attempts, last_error, error_fp, holds)
SELECT id, topic, uuid, payload, metadata, key, key_hash, created_at, attempts, last_error, error_fp, key IS NOT NULL FROM ` + values + `
ON CONFLICT DO NOTHING`
	case writtenKept:
		q = `INSERT INTO ` + d.kept + ` (` + messageColumns + `)
SELECT id, topic, uuid, payload, metadata, key, key_hash, created_at FROM ` + values + `
ON CONFLICT DO NOTHING`
	default:
		q = `INSERT INTO ` + d.outbox + ` (` + messageColumns + `, attempts, last_error, error_fp, next_attempt_at) OVERRIDING SYSTEM VALUE
SELECT id, topic, uuid, payload, metadata, key, key_hash, created_at, attempts, last_error, error_fp, now() + backoff * interval '1 microsecond'
FROM ` + values + ` WHERE NOT EXISTS (SELECT 1 FROM ` + d.dead + ` x WHERE x.id = w.id)
ON CONFLICT DO NOTHING`
	}
	return sqladapters.Query{SQL: q, Args: args}
}

// IsDuplicateObject tells a publication or slot a concurrent caller
// created first.
func (d *sqlDialect) IsDuplicateObject(err error) bool {
	s := sqlState(err)
	return s == "42710" || s == "23505"
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
