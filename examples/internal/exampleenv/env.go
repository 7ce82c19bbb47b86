package exampleenv

import "os"

// The services the examples expect when no flag names them: the same local
// defaults as the integration tests.
const (
	defaultPostgresURL = "postgres://root@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQLDSN    = "root@tcp(127.0.0.1:3306)/test?parseTime=true"
	defaultAMQPURL     = "amqp://guest:guest@127.0.0.1:5672/"
	defaultNATSURL     = "nats://127.0.0.1:4222"
	defaultRedisAddr   = "127.0.0.1:6379"
)

// PostgresURL returns $MILLBOX_POSTGRES_URL, or a local database if it is
// unset.
func PostgresURL() string { return getenv("MILLBOX_POSTGRES_URL", defaultPostgresURL) }

// MySQLDSN returns $MILLBOX_MYSQL_DSN, or a local database if it is unset.
func MySQLDSN() string { return getenv("MILLBOX_MYSQL_DSN", defaultMySQLDSN) }

// AMQPURL returns $MILLBOX_AMQP_URL, or a local RabbitMQ if it is unset.
func AMQPURL() string { return getenv("MILLBOX_AMQP_URL", defaultAMQPURL) }

// NATSURL returns $MILLBOX_NATS_URL, or a local NATS server (with
// JetStream) if it is unset.
func NATSURL() string { return getenv("MILLBOX_NATS_URL", defaultNATSURL) }

// RedisAddr returns $MILLBOX_REDIS_ADDR, or a local Redis if it is unset.
func RedisAddr() string { return getenv("MILLBOX_REDIS_ADDR", defaultRedisAddr) }

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
