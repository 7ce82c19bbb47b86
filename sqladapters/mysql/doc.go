// Package mysql is the MySQL and MariaDB dialect of millbox: the outbox,
// lease and inbox tables, their migrations, and every statement the
// publisher, forwarder and inbox run, which it executes on the DB or
// transaction it is given (the store contract, sqladapters.Dialect): pass it
// those of sqladapters/stdsql (over a *sql.DB or *sql.Tx of
// github.com/go-sql-driver/mysql) or sqladapters/wmsql (watermill-sql's
// sql.TxFromStdSQL). It imports the
// driver only to read MySQL error numbers in ClassifyError.
//
// It needs MySQL 5.7 or later, or MariaDB 10.2 or later (InnoDB,
// utf8mb4, DATETIME(6), stored generated columns), and works the same on
// both.
//
// # Connection settings
//
// A DSN for go-sql-driver/mysql looks like
//
//	user:pass@tcp(host:3306)/app?parseTime=true&interpolateParams=true
//
// What matters in it and on the server:
//
//   - parseTime=true is required: the dead-letter API scans DATETIME
//     columns into time.Time.
//   - loc: leave it at its default, UTC. Every time is stored in UTC
//     (see below); another loc labels the times read back with the wrong
//     zone. The session time_zone does not matter.
//   - interpolateParams=true is recommended. Without it the driver
//     prepares a server-side statement for every call with arguments,
//     executes it and closes it: two round trips instead of one. It is safe
//     with the driver's default utf8mb4 character set.
//   - charset/collation: keep utf8mb4 (the driver's default). A utf8
//     (utf8mb3) connection cannot carry four-byte characters such as emoji
//     in metadata.
//   - Options.MaxAllowedPacket must not exceed the server's
//     max_allowed_packet (DetectMaxAllowedPacket reads it). The dialect
//     limits a message to half of it (Dialect.MaxMessageBytes: escaping
//     may double every byte) and the publisher refuses larger ones, so a
//     statement never outgrows a packet; the server would refuse it and
//     close the connection. The default, 16 MiB, is MariaDB's; on MySQL
//     5.7 (4 MiB) set it lower. The driver reads the server's value when
//     maxAllowedPacket=0; its default of 64 MiB only limits the client
//     side.
//   - sql_mode should stay strict (STRICT_TRANS_TABLES, the default since
//     MySQL 5.7 and MariaDB 10.2.4), so an over-long topic fails instead of
//     being cut.
//   - Either REPEATABLE READ (the default) or READ COMMITTED works for
//     application transactions; the forwarder runs single statements in
//     autocommit mode.
//   - With binary logging, use binlog_format ROW or MIXED (the defaults):
//     partition claims and inbox cleanup are UPDATE/DELETE ... LIMIT, which
//     statement-based replication flags as unsafe.
//   - clientFoundRows and multiStatements may have any value.
//
// # Time
//
// Lease expiries, backoff and every stored time come from the database
// clock, UTC_TIMESTAMP(6), into DATETIME(6) columns, never from the client.
// UTC_TIMESTAMP rather than NOW keeps times comparable across sessions with
// different time_zone settings and through daylight-saving changes, and
// DATETIME rather than TIMESTAMP has no year-2038 limit.
//
// # Migrations
//
// MySQL commits DDL implicitly, so Features().TransactionalDDL is false:
// sqladapters.MigrateTx refuses this dialect, and sqladapters.Migrate
// applies the statements one by one. Concurrent migrators serialize on a
// GET_LOCK named after the database and outbox table
// (Options.MigrationLockTimeout bounds the wait), and every statement is
// idempotent, so a migration interrupted halfway simply runs again.
//
// # SKIP LOCKED
//
// Features().SkipLocked reports Options.SkipLocked; the dialect does not
// guess. DetectSkipLocked reads the server version and tells whether the
// server has SKIP LOCKED (MySQL 8.0.1+, MariaDB 10.6+). The dialect needs
// it nowhere: the forwarder's exclusivity comes from partition leases kept
// in lease columns (owner, expires_at) that one UPDATE ... ORDER BY ...
// LIMIT claims. With SkipLocked set, claims skip lease rows that another
// instance is claiming at that moment instead of waiting for it. The move
// of due scheduled messages never skips: concurrent moves wait for each
// other at the earliest due row, so a key's delayed messages reach the
// outbox in due order.
//
// # Tables
//
// The outbox keeps payloads as LONGBLOB (any bytes) and metadata as
// LONGTEXT holding the JSON object the publisher wrote, byte for byte.
// Topics, UUIDs and ordering keys are LONGTEXT too, and no index holds
// them, so their length is bounded only by the message limit. A
// JSON column would validate and, on MySQL, reorder it on every insert for
// no gain: the forwarder reads it back whole. Ids are BIGINT
// AUTO_INCREMENT. On MySQL before 8.0 and MariaDB before 10.2.4 a server
// restart resets the counter to the largest id left plus one, so ids of
// deleted rows may come back after a restart on those versions.
//
// The outbox holds only rows that still have to go: dead letters and the
// forwarded rows kept for audit move, under their ids, to the tables
// <outbox>_dead and <outbox>_kept, and a requeue moves a dead letter back.
// So the forwarder reads pending rows in id order through the primary
// key, walking no dead or kept row. MySQL has no partial indexes, so the
// rows waiting for a retry are marked in a small table of their own,
// <outbox>_retries, by key hash: the check that holds a key's later rows
// behind its retry is one lookup there, however large the backlog. The
// forwarder's read names the primary keys (FORCE INDEX): going by
// statistics, the optimizer would sort the outbox or scan the markers for
// every row. The generated columns state and retry_hash of earlier
// versions stay in the outbox, unindexed and unused.
//
// Inbox keys, lease owners and member names are VARBINARY, compared byte
// by byte. A value longer than its column (255 bytes, 512 for message ids)
// is stored as its SHA-256, never truncated.
//
// # Fleet control tables
//
// NewFleet returns the control tables of a forwarder fleet
// (sqladapters.FleetStore) in a database of the server. Claims pick
// tenants with SELECT ... FOR UPDATE (SKIP LOCKED with
// FleetOptions.SkipLocked, on MySQL 8.0.1+ and MariaDB 10.6+), take them
// with an UPDATE that checks them again, and read them back. Transactions
// that InnoDB rolls back for a deadlock (concurrent puts of new tenants
// take gap locks) run again, up to five times.
package mysql
