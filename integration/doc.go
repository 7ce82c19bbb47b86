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
// Subpackages: testenv (service discovery and isolation), conformance (the
// suites every dialect and driver runs), bench (the benchmark program).
package integration
