// Package fleet forwards a changing set of tenant outboxes (databases and
// schemas, on several servers) from a set of instances that share the
// tenants by leases in a control database, with a bounded number of
// connections: an idle tenant holds none, a busy one keeps the fast path
// of a single outbox.
package fleet
