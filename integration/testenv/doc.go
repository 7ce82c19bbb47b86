// Package testenv finds the services integration tests need and isolates
// each test: a fresh schema or table prefix per test, dropped afterwards.
//
//	MILLBOX_POSTGRES_URL  default postgres://root@127.0.0.1:5432/test?sslmode=disable
//	MILLBOX_MYSQL_DSN     default root@tcp(127.0.0.1:3306)/test?parseTime=true
//	MILLBOX_AMQP_URL      default amqp://guest:guest@127.0.0.1:5672/
//	MILLBOX_NATS_URL      default nats://127.0.0.1:4222 (JetStream enabled)
//	MILLBOX_REDIS_ADDR    default 127.0.0.1:6379
//
// Kafka needs no service: StartKafka runs franz-go's kfake in process.
// SQLite needs none either: SQLitePath and SQLite open a file in the
// test's temporary directory. StartNATSServer and StartRedisServer run a
// server of the test's own, on a port of its own, for tests that stop and
// restart it. StartPostgresPair runs a PostgreSQL primary and a
// synchronous streaming standby of the test's own, for failover tests
// (PostgreSQL's server binaries: MILLBOX_PG_BIN, else the newest
// /usr/lib/postgresql/<version>/bin; run as the postgres OS user when the
// tests run as root).
package testenv
