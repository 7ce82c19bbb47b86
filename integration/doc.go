// Package integration holds millbox's tests against real services:
// PostgreSQL, MariaDB/MySQL, RabbitMQ, NATS with JetStream, Redis, and the
// Kafka protocol (served by franz-go's kfake). Services are found through environment variables with
// localhost defaults (see testenv). With CI=true a missing service fails the
// run; elsewhere the test is skipped with a message saying what to start.
//
// The outage tests stop a broker in the middle of a stream and start it
// again. MILLBOX_LONG=1 runs their long version (a 20 s outage in a
// 30,000-message stream instead of 3 s in 4,000). Those that stop the
// shared RabbitMQ run only with MILLBOX_BROKER_RESTARTS=1, and then alone:
// they disturb every other test using it. The NATS and Redis outage tests
// run a nats-server or redis-server of their own on another port (the
// binaries are found in PATH, /usr/sbin or /usr/bin) and stop that one.
//
// The failover tests (failover_test.go) run a PostgreSQL primary and a
// synchronous standby of their own, on ports of their own, kill or stop
// the primary under a steady load and promote the standby; they need
// PostgreSQL's server binaries (initdb, postgres, pg_basebackup), which CI
// requires.
//
// Subpackages: testenv (service discovery and isolation), conformance (the
// suites every dialect and driver runs), failover (the failover scenario
// the tests and the benchmark share), bench (the benchmark program).
package integration
