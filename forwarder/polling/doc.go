// Package polling is the forwarder's source that reads the outbox table,
// on every database (forwarder.Polling is its Source). The other source is
// forwarder/cdc, which streams the table's inserts from PostgreSQL's
// logical replication.
//
// It owns where rows come from and who may take them: reads of pending
// rows in id order (source.go), the floor below which no row can be
// pending any more (horizon.go), the leases through which instances share
// the outbox's partitions (leases.go; acquire.go for exactly once), and
// the ways it learns of new rows without reading: the outbox's high-water
// mark, notifications (listen.go, probe.go) and in-process wakeups. The
// forwarding engine does the rest (package forwarder/internal/engine).
//
// It may import the source contract (forwarder/internal/source), the
// forwarder's internal helpers (retry, wake) and sqladapters, never the
// forwarder or the engine.
package polling
