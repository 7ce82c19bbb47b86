// Package wake carries signals between the outbox publishers and the
// forwarders of one process: a publisher that wrote rows pings the
// forwarders of the same outbox table (Rows), and one that stored delayed
// messages tells them the earliest due time (Due), so that databases
// without notifications (MySQL, SQLite) still forward with low latency
// when publisher and forwarder share a process. A ping comes before the
// writing transaction commits, so a woken forwarder may find nothing yet
// and looks again shortly after. It imports only the standard library.
package wake
