// Package destination is the contract between millbox's forwarder and the
// publishers it hands messages to. A destination is any Watermill
// message.Publisher; this package holds what a destination may say back
// and read beyond that interface:
//
//   - the ordering key of each message (Key, KeyMetadataField), which the
//     forwarder takes from the outbox row and sets on every message, so a
//     destination never guesses it from the producer's metadata;
//   - how a call failed: PartialError for a batch delivered in part,
//     ErrDestinationUnavailable (and DestinationUnavailable) for a broker
//     that is down rather than a message that is bad, ErrClosed;
//   - the exactly-once contract: TxDestination, publishing a partition's
//     messages in transactions together with the forwarder's progress,
//     and its errors TxAbortedError and ErrFenced;
//   - the call's deadline: the forwarder sets a deadline on the context of
//     the messages of a Publish call (and on PublishTx's context) at its
//     PublishTimeout, so a destination with timeouts of its own derives
//     them from the context rather than contradicting it.
//
// Batching destinations (forwarder/kafkabatch, forwarder/amqpbatch,
// forwarder/redisbatch) and user-written ones import this package, not the
// forwarder. It imports only Watermill's message package and the shared
// lifecycle's ErrClosed.
package destination
