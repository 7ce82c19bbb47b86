package exampleenv

import (
	"fmt"
	"os"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// DeleteQueue deletes a run's queue from the RabbitMQ at url, reporting a
// failure on standard error: a failed clean-up must not fail the example.
// Durable queues outlive the connections that declared them, so without it
// every run would leave one behind.
func DeleteQueue(url, queue string) {
	if err := deleteQueue(url, queue); err != nil {
		fmt.Fprintf(os.Stderr, "cleanup: delete queue %s: %v\n", queue, err)
	}
}

func deleteQueue(url, queue string) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	_, err = ch.QueueDelete(queue, false, false, false)
	return err
}
