// Package integration holds millbox's tests against real services:
// PostgreSQL, MariaDB/MySQL, RabbitMQ, and the Kafka protocol (served by
// franz-go's kfake). Services are found through environment variables with
// localhost defaults (see testenv). With CI=true a missing service fails the
// run; elsewhere the test is skipped with a message saying what to start.
//
// Subpackages: testenv (service discovery and isolation), conformance (the
// suites every dialect and driver runs), bench (the benchmark program).
package integration
