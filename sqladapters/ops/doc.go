// Package ops holds the operations an operator runs on a millbox
// installation without writing code or SQL: the status of the outbox and
// inbox, dead-letter search, grouping, inspection, requeue and discard, and
// pruning of forwarded rows and old inbox records.
//
// The millbox command (sqladapters/cmd/millbox) and the admin page
// (sqladapters/admin) are thin front ends over it. Build an Ops with New
// from a database handle and a dialect:
//
//	o, err := ops.New(pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{}))
//	st, err := o.Status(ctx)
//	n, err := o.Requeue(ctx, ops.Filter{ErrorContains: "connection refused"}, ops.ChangeOptions{})
//
// A dead letter is a message whose delivery failed
// forwarder.Config.MaxAttempts times: it leaves the outbox for the dead
// letters' table (the outbox's name with _dead), under its id, with its
// last error, and later rows of its key go ahead. Requeue makes
// it pending again with a fresh attempt count; it then arrives after the
// messages of its key that went ahead (its age counts from the requeue).
// Discard deletes it. A dead letter recorded by a forwarder with
// forwarder.Config.DeadLetterHoldsKey holds its key instead: the key's
// later rows wait behind it (HeldKeys lists the held keys and counts
// them), Requeue sends it first and them after it, in order, and Discard
// lets them go on. Prune deletes forwarded rows kept for audit
// (forwarder.Config.KeepForwarded) and inbox records older than a cut-off.
// The runnable examples of package sqladapters/sqlite/modernc show a dead
// letter requeued (Example_ops) and the admin page (Example_adminPage).
//
// It is the one dead-letter API for applications and tools: list, show,
// count, group, requeue and discard. The operations run the verbs of the
// store contract, sqladapters.Dialect, which each database's dialect
// executes with SQL of its own (sqladapters/postgres, sqladapters/mysql
// and sqladapters/sqlite), so they work the same on every database.
//
// # Security
//
// Operations read and change what the database role of db may: whoever
// calls them can requeue and discard. A front end must authenticate its
// users and grant changes to operators only (sqladapters/admin asks its
// embedding application through Config.View and Config.Authorize). Topics,
// keys, errors, metadata and payloads are attacker-controlled text: escape
// it for the medium (EscapeControls for a terminal, html/template for a
// page). Listings read no payloads unless ListQuery.Payloads asks, and an
// error group (Filter.Fingerprint) is read through an index, so that a
// page of them costs little however many dead letters there are; a
// substring filter (Filter.ErrorContains) reads every dead letter's error.
//
// Dead letters and forwarded rows kept for audit live in tables of their
// own (the outbox's name with _dead and _kept): the outbox holds only rows
// that still have to go. Requeue moves dead letters back into the outbox
// under their ids, Discard and Prune delete from the other tables.
//
// Every operation is safe while forwarders and consumers run: none of them
// touches a pending outbox row, Requeue only adds rows to the outbox, and
// each change runs in bounded batches, each its own short transaction,
// rather than one long one.
package ops
