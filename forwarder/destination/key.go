package destination

import "github.com/ThreeDotsLabs/watermill/message"

// KeyMetadataField is the metadata field in which the forwarder hands a
// destination the ordering key of each message: the key stored with the
// outbox row, whatever field the producer's publisher took it from
// (forwarder.PublisherConfig.KeyMetadataField). The forwarder sets it on
// every message of a row with a key, replacing a value the producer may
// have set under this name, and leaves the metadata of a message without
// a key as it is.
//
// A Watermill publisher keys by it with its own configuration, such as
// watermill-kafka's partitioning marshaler:
//
//	kafka.NewWithPartitioningMarshaler(func(_ string, msg *message.Message) (string, error) {
//		return destination.Key(msg), nil
//	})
//
// It is also the default of forwarder.PublisherConfig.KeyMetadataField, so
// with default settings the producer's field and this one are the same.
const KeyMetadataField = "partition_key"

// Key returns the ordering key of a message the forwarder hands a
// destination: the value of KeyMetadataField, "" for a message without a
// key.
func Key(msg *message.Message) string {
	return msg.Metadata.Get(KeyMetadataField)
}
