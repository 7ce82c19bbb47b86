// Package sqlite is the SQLite dialect of millbox: the outbox, lease and
// inbox tables, their migrations, and every statement the publisher,
// forwarder and inbox run, which it executes on the DB or transaction it is
// given (the store contract, sqladapters.Dialect). It imports no driver:
// pass it a DB of sqladapters/stdsql with any database/sql SQLite driver. It needs
// SQLite 3.38 or later (built-in JSON functions, upserts, 32,766 bound
// parameters per statement).
//
// The subpackage sqladapters/sqlite/modernc opens a *sql.DB on the pure-Go
// modernc.org/sqlite driver with the settings below on every pooled
// connection. It is a module of its own so that users of another driver
// (mattn/go-sqlite3, ncruces/go-sqlite3) never compile modernc, and because
// per-connection settings are easy to get wrong: a PRAGMA run once through
// db.Exec reaches one pooled connection, not the others.
//
// # One writer at a time
//
// SQLite serializes write transactions: there are no row locks, so there is
// no SKIP LOCKED and no concurrent writers (see Dialect.Features). What
// millbox needs from the connection:
//
//   - journal_mode=WAL, so readers do not block the writer nor it them.
//   - busy_timeout (5s in the modernc helper), so a writer waits for the
//     lock instead of failing at once with SQLITE_BUSY.
//   - synchronous=NORMAL: under WAL a commit then needs no fsync. An
//     application crash loses nothing; an OS crash or power loss may lose
//     the last commits but never corrupts the file. Use FULL if that
//     matters more than write throughput.
//   - write transactions that take the lock when they begin: BEGIN
//     IMMEDIATE, which the DSN parameter _txlock=immediate selects in both
//     modernc and mattn. A deferred transaction that reads first and writes
//     later cannot wait for the lock: if another writer holds it, or
//     committed since the read, the write fails with SQLITE_BUSY at once,
//     whatever the busy timeout. millbox's own transactions write first
//     (the inbox insert, the migration lock; the forwarder runs single
//     statements), so they work either way; the setting protects
//     application transactions that read before they write, such as a
//     handler that reads and then publishes. With modernc, transactions
//     begun with sql.TxOptions{ReadOnly: true} stay deferred and do not
//     block writers.
//
// Keep write transactions short: while one is open, every other writer
// waits, and gives up with SQLITE_BUSY after the busy timeout. Code that
// holds a transaction must write through it, not through the *sql.DB: a
// second connection would wait for the lock its own transaction holds.
//
// # Connection pool
//
// Do not set SetMaxOpenConns(1). It serializes readers behind the writer
// (losing WAL's concurrent reads) and deadlocks any code that holds a
// transaction and then waits for another connection, as a handler under the
// inbox middleware does when it queries the *sql.DB directly. A small pool
// (the modernc helper uses 8) lets readers run in parallel while writers
// queue on SQLite's lock; transactions beyond the pool size queue fairly in
// database/sql instead of polling SQLite's lock.
//
// # Tables and time
//
// Ids are INTEGER PRIMARY KEY AUTOINCREMENT: without AUTOINCREMENT SQLite
// hands out max(id)+1, so once the forwarder deletes the newest rows their
// ids would be reused, and a forwarder or an operator paging dead letters
// by id could mistake a new row for an old one. Because writers are
// serialized, ids also follow commit order.
//
// Times are UTC text in TimeLayout, such as 2024-05-01T12:00:00.000Z, read
// from SQLite's clock with millisecond precision. The fixed width makes text
// order time order, so comparisons and indexes work on the text; it is
// readable in the sqlite3 shell; and the columns are declared TIMESTAMP, so
// drivers that convert by declared type (modernc, mattn) scan them into
// time.Time.
//
// Tables live in the main database. Attached databases are not supported:
// ATTACH is per connection, so every pooled connection would need it.
//
// # Fleet control tables
//
// NewFleet returns the control tables of a forwarder fleet
// (sqladapters.FleetStore), for tests and fleets in one process. Claims
// take turns on SQLite's write lock; every transaction of the store
// writes first, so it works with deferred transactions too.
package sqlite
