// Package source is the contract between the forwarding engine (package
// forwarder/internal/engine) and the sources of rows it drives: the
// polling source (package forwarder/polling) and logical replication
// (package forwarder/cdc). It imports sqladapters and OpenTelemetry's
// API only.
//
// The engine owns lanes, calls, failure records, dead letters, the breaker,
// deletes, telemetry and the lifecycle. A source owns where rows come from
// and what it must remember about them: it hands rows to the engine with
// Add and learns each row's fate through Delivered, Completed and Left.
//
// Everything a source does to its own state happens on the engine's loop
// goroutine: in Step, in the callbacks, in the closures of its Feed and in
// the functions it passes to Engine.Do. Its own goroutines (reads, a
// replication stream, lease renewals) hand results over through Do, so a
// source needs no locks for the state it shares with the engine.
package source
