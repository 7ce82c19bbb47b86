// Package modernc opens SQLite databases for millbox with the pure-Go
// modernc.org/sqlite driver (no cgo), with the settings the SQLite dialect
// needs on every pooled connection: WAL journal, a busy timeout,
// synchronous=NORMAL and write transactions that take the lock when they
// begin. See package sqladapters/sqlite for why each one matters.
//
// It is the only millbox package that imports modernc.org/sqlite; the
// dialect itself works with any database/sql SQLite driver. It is a module
// of its own, so that the driver stays out of the module graph of
// applications on other databases:
//
//	go get github.com/millbox/millbox/sqladapters/sqlite/modernc
//
// Its examples run millbox's main entry points on a SQLite file, with
// checked output, so that they run anywhere (go test -run Example):
// Example_migrate (sqladapters.Migrate), Example_publishTx (the outbox
// publisher in a transaction), Example_forwarder (forwarder.New),
// Example_inboxMiddleware (middleware.NewInbox), Example_ops (a dead
// letter found and requeued with sqladapters/ops) and Example_adminPage
// (sqladapters/admin). The health handler's runnable example is in
// package forwarder (ExampleHealthHandler).
package modernc
