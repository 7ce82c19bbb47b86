// Package engine is the forwarding engine: it takes rows from a source
// (package forwarder/internal/source: the polling source or change data
// capture), keeps them in one lane per ordering key, publishes each lane's
// rows in order, one call at a time, records failures and dead letters,
// pauses everything behind one probe while the destination is down,
// removes published rows, and in exactly-once mode publishes a
// partition's lanes in destination transactions.
//
// It is built from a Config of its own and reports what it does to an
// Observer; it holds no pointer back to the forwarder. It may import the
// destination contract, the source contract, sqladapters and the
// forwarder's internal helpers (failure, retry, metadata), never the
// forwarder or a source.
//
// Structure: the loop goroutine owns all in-flight state (lanes: engine.go;
// the breaker: breaker.go; exactly-once partitions: txn.go). Destination
// calls (call.go: one runner for a Publish call and a transaction),
// failure records (failure.go) and the removal of published rows (package
// forwarder/internal/completer) run on goroutines of their own and report
// to the loop through channels; the source's goroutines hand their results
// over through Do.
package engine
