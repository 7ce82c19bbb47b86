package kafkaid

import (
	"errors"
	"strconv"

	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"
)

// MessageID returns "topic/partition/offset" for a message consumed by a
// watermill-kafka v3 subscriber in a Watermill router. Use it as
// middleware.InboxConfig.MessageID. The partition and offset come from the
// message context (kafka.MessagePartitionFromCtx and
// kafka.MessagePartitionOffsetFromCtx), the topic from the router
// (message.SubscribeTopicFromCtx). A message without them fails, and the
// inbox middleware then reports middleware.ErrNoMessageID.
func MessageID(msg *message.Message) (string, error) {
	ctx := msg.Context()
	topic := message.SubscribeTopicFromCtx(ctx)
	if topic == "" {
		return "", errors.New("kafkaid: no subscribe topic in the message context (is the message consumed through a Watermill router?)")
	}
	partition, ok := kafka.MessagePartitionFromCtx(ctx)
	if !ok {
		return "", errors.New("kafkaid: no Kafka partition in the message context (is the message consumed by watermill-kafka v3?)")
	}
	offset, ok := kafka.MessagePartitionOffsetFromCtx(ctx)
	if !ok {
		return "", errors.New("kafkaid: no Kafka offset in the message context (is the message consumed by watermill-kafka v3?)")
	}
	return topic + "/" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10), nil
}
