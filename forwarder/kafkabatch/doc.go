// Package kafkabatch is a Watermill publisher for Kafka that produces all
// the messages of one Publish call together and waits for their
// acknowledgements once, instead of one synchronous round trip per message
// as watermill-kafka's publisher does. The forwarder hands each key's
// consecutive messages to one Publish call (Config.PublishBatch), so with
// this publisher a key's backlog leaves in one round trip.
//
// Messages are marshaled with a watermill-kafka Marshaler and partitioned
// as sarama partitions them, so a key lands on the partition
// watermill-kafka's publisher would pick and consumers using
// watermill-kafka's subscriber read the records as usual. The default
// marshaler makes the ordering key the forwarder stored with each row
// (destination.Key, whatever metadata field the producer set it in) the
// Kafka record key.
//
// # Order under failure
//
// A batch publisher must never let Kafka write a later message of a key
// after an earlier one failed, and must tell the forwarder exactly which
// messages were written (destination.PartialError). The publisher is built
// on franz-go's kgo client with idempotent writes, because kgo gives that
// per partition and sarama does not:
//
//   - With idempotent writes each partition's batches carry sequence
//     numbers and the broker appends a batch only if it follows the last
//     one it appended from this producer; a retried batch cannot land
//     after a later one, and a later one is refused while an earlier one is
//     missing.
//   - When kgo fails a batch (an error response, the record's deadline, a
//     closed client) it fails every record buffered for that partition
//     after it as well, and then moves to a new producer epoch: "the client
//     will not fail one record only to produce a later one successfully"
//     (kgo's RecordRetries and Produce documentation). So the records of
//     one call that Kafka acknowledged are a prefix of the call, and
//     Publish reports that prefix.
//   - sarama fails messages one by one (a message whose retries run out,
//     or whose partition leader cannot be found, is returned while the
//     messages behind it continue, under a bumped epoch when idempotent),
//     so SendMessages can report a failed message between written ones.
//     That is how an earlier version of this package, on sarama, let later
//     records of a key overtake their failed predecessors when the broker
//     restarted. It also allows one request in flight per broker when
//     idempotent, where kgo pipelines five: draining 100,000 outbox rows
//     to Kafka through the forwarder, this publisher moved 2.3–2.4 times
//     as many messages per second as the sarama one did.
//
// A record whose request was written but not answered (the connection
// died) could be on the broker already. kgo normally waits for the answer
// before failing it; this publisher allows failing it when the call's
// time is up (kgo.AllowIdempotentProduceCancellation), so that a call ends
// in bounded time while the broker is down. The cost is a possible duplicate when the
// forwarder publishes that record again, never a reordering: the failed
// records' successors of the partition fail with them, and the retry
// produces under the new epoch, behind whatever the old one wrote.
//
// Messages that cannot be produced at all (a marshaling error, a message
// larger than a record batch may be) end the call before them: the
// messages ahead of them are produced and reported as the delivered
// prefix, the rest are not sent.
//
// Failures of the broker rather than of a message (unreachable, connection
// lost, no acknowledgement in time, Kafka's retriable errors) wrap
// destination.ErrDestinationUnavailable and say which of these happened.
//
// # Timeouts
//
// A call's time is that of its context: the forwarder sets the deadline of
// the messages' context in Publish, and of PublishTx's context, at its
// PublishTimeout, so a call gives up when the forwarder stops waiting for
// it, not before and not after. Config.DeliveryTimeout, when set, bounds a
// call further (the earlier limit wins); a call whose context has no
// deadline (Publish called outside a forwarder, the forwarder's claims)
// waits DeliveryTimeout, or DefaultDeliveryTimeout when that is not set.
// A transaction is also given up at TxConfig.TransactionTimeout, after
// which the brokers abort it. Errors name the limit that ended a call.
//
// # Exactly once
//
// TxPublisher publishes the forwarder's rows in Kafka transactions, for a
// forwarder with forwarder.Config.ExactlyOnce; read_committed consumers
// then see every outbox row exactly once (see the forwarder package doc,
// Exactly once, for the whole argument and for the consumers' settings):
//
//	pub, err := kafkabatch.NewTxPublisher(kafkabatch.TxConfig{
//		Config:          kafkabatch.Config{Brokers: brokers},
//		TransactionalID: "orders-outbox", // unique per outbox
//	})
//	fw, err := forwarder.New(forwarder.Config{DB: db, Dialect: d, Destination: pub, ExactlyOnce: true})
//
// Each partition of the outbox a forwarder holds gets a transactional
// producer of its own, with the transactional.id
// TransactionalID-<partition>. Claiming a partition (ClaimPartition, when
// the forwarder takes it) initializes that producer: the broker aborts the
// transaction the previous holder has open and refuses any commit of it
// afterwards. The claim then writes a mark to the control topic and reads
// the partition's progress record with read_committed up to that mark:
// every transaction of the partition that committed is visible by then.
//
// Each transaction writes the rows' messages (partitioned as the Publisher
// does, so a key keeps its Kafka partition) and one progress record to
// the control topic (TxConfig.ControlTopic, key TransactionalID/<partition>,
// partition 0), which the forwarder reads back at the next claim. The
// control topic must be compacted and nothing else: the forwarder's start
// creates it so when it is missing and refuses one that is not
// (cleanup.policy), since a progress record deleted by retention could
// let a new holder publish rows again. It may be shared by several
// outboxes; TransactionalID must be unique per outbox among everything
// that uses the cluster.
//
// Outcomes: messages that cannot be produced (marshaling, a record larger
// than a batch may be) fail their batch before the transaction begins;
// records the broker refuses abort the transaction, and the batches of the
// refused records are reported (destination.TxAbortedError), the forwarder
// then sending the failing key alone until it knows the failing message. A
// commit that returns an error, a produce refused because another holder
// fenced this one, and a transaction that does not finish in time (see
// Timeouts) close the partition's producer: its outcome is left to the
// next claim. Brokers that refuse transactions (an ACL on
// transactional ids, no transaction coordinator) fail the forwarder's
// start, before anything is sent.
//
// This package is optional: it is the only part of millbox's library code
// that imports a Kafka client, and a module of its own, so that the client
// stays out of the module graph of applications that do not use it:
//
//	go get github.com/millbox/millbox/forwarder/kafkabatch
package kafkabatch
