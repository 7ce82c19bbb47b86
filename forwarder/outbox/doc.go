// Package outbox is the writing side of millbox: the Publisher, a
// Watermill message.Publisher that writes messages into the outbox table
// inside the caller's transaction (or, without a table, into PostgreSQL's
// write-ahead log), so they commit or roll back with the business rows.
// The forwarder (package forwarder, which re-exports these names:
// forwarder.NewContextPublisher, forwarder.PublisherConfig, ...) moves
// them on.
//
// It owns what a stored message is: the checks that refuse what cannot be
// stored faithfully (ErrInvalidMessage, before anything is written), the
// ordering key and its hash (KeyHash), the trace context carried in the
// metadata, and the due time of a delayed message (DeliverAt,
// DeliverAfter). It may import sqladapters, the destination contract,
// the telemetry settings and the forwarder's internal helpers (emit,
// wake), never the forwarder.
package outbox
