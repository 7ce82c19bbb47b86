// Package forwarder is millbox's outbox: a Watermill message.Publisher that
// writes messages into the outbox table inside the application's own
// transaction, and the Forwarder that moves committed rows to any Watermill
// message.Publisher (Kafka, RabbitMQ, NATS, ...), at least once, in order
// per key.
//
// # Publishing
//
// Publisher has two modes. NewPublisher binds it to one transaction.
// NewContextPublisher makes a long-lived publisher that finds the
// transaction in each message's context (put there by sqladapters.WithTx or
// by the inbox middleware), so one cqrs.EventBus can serve a whole
// application. Either way a message never goes out without a transaction:
// without one Publish fails with ErrNoTx. The rows commit or roll back with
// the business rows. A message the outbox cannot store faithfully fails
// with ErrInvalidMessage naming the field and the limit, before anything
// reaches the database, and the transaction stays usable.
//
// Publisher.PublishTx takes the transaction as an argument instead, so one
// publisher made at start serves every transaction. A call that fails
// writes nothing, even when the database refuses its last row (calls of
// several statements run under a savepoint). Wrap the transaction the
// application holds with sqladapters/pgxv5 (pgx.Tx), sqladapters/stdsql
// (*sql.Tx) or sqladapters/wmsql (watermill-sql's sql.Tx).
//
// The ordering key of a message is its metadata field partition_key
// (DefaultKeyMetadataField; PublisherConfig.KeyMetadataField names
// another), or what PublisherConfig.OrderingKey derives from the message
// for producers that cannot set metadata. Outbox order is commit order when
// the writers of one key serialize, for example by updating the
// aggregate's row before publishing; two transactions writing the same key
// concurrently have no defined order between them.
//
// # Delayed messages
//
// A message whose metadata carries Watermill's delay fields is held back
// until its due time: _watermill_delayed_until (RFC 3339, as
// delay.Message from github.com/ThreeDotsLabs/watermill/components/delay
// sets it) or, without it, _watermill_delayed_for (a Go duration counted
// from the Publish call). DeliverAt and DeliverAfter set the same fields
// with the time to the nanosecond; delay.Until and delay.For write it to
// the second, so such a message is due at the start of that second. A
// due time that has passed publishes the message at once. A value that
// cannot be read fails Publish with ErrInvalidMessage naming the field and
// the value, and nothing of the call is written. The fields stay in the
// metadata the destination receives.
//
// A delayed message is written, in the caller's transaction, into a table
// of its own (the outbox's name with _scheduled, ordered by due time), so
// the outbox keeps only rows that must go now and the forwarder's read
// stays a walk of the outbox's primary key however many messages wait.
// Every forwarder instance, with either source, moves due messages into
// the outbox in one transaction per batch (sqladapters.Dialect.MoveDue;
// concurrent instances never move a message twice, and one move runs at a
// time per outbox, so a key's due messages enter the outbox in due order
// whatever the number of instances): at least once per
// Config.DelayedPollInterval (1 s), and at the earliest due time it knows
// of. It learns that time from the table at each look and at once from
// publishers in its own process. A delayed message therefore arrives no
// earlier than its due time and normally within DelayedPollInterval after
// it;
// due times are compared with the clock of the forwarder's machine. While
// no forwarder runs, due messages wait. The table comes with migration 7;
// a forwarder refuses to start without it. A publisher with
// PublisherConfig.WithoutTable writes its delayed messages into the same
// table (the write is unavoidable) and the rest of the call into the log.
//
// Order: a delayed message does not hold back the undelayed messages of
// its key published after it. When it is moved it becomes an ordinary
// outbox row of its key and takes its place there: after the key's
// messages already in the outbox at that moment, before those published
// later. Delayed messages of a key due at the same time keep their publish
// order; those with different due times go in due-time order. Pending
// counts leave scheduled messages out: sqladapters.OutboxStats,
// ops.Status, the millbox command, the admin page and the
// millbox.outbox.scheduled gauge count them on their own, and a delayed
// message's pending age counts from when it was moved.
//
// # One engine, two sources
//
// A Forwarder is one engine driving one source of rows (Config.Source).
// The engine owns what every promise below rests on: a lane per ordering
// key, destination calls bounded by PublishTimeout, failure records paced
// by Config.Retry and dead letters, the breaker that turns an outage into
// one event, deletes of published rows; the forwarder adds metrics and
// spans and the lifecycle (Run, Ready, Running, Close). The source only
// finds rows and learns what became of them:
//
//   - Polling (the default) reads the outbox table on every database. It
//     finds new rows by watching the outbox's high-water mark, or through
//     notifications on Postgres; instances share the outbox by leasing
//     partitions of its keys.
//   - cdc.Source (package forwarder/cdc) streams the table's inserts
//     through PostgreSQL's logical replication: lower latency without
//     polling, at the price of a replication slot to operate. A key whose
//     row failed is read from the table until it has caught up, then goes
//     back to the stream.
//
// The guarantees hold the same for both sources; one conformance suite of
// the forwarder and its faults runs on each.
//
// The parts, each a package that says what it owns and may import:
// forwarder/outbox (the Publisher; this package re-exports its names),
// forwarder/destination (what a destination may say back: the contract
// batching publishers implement), forwarder/polling and forwarder/cdc (the
// sources), forwarder/telemetry (metrics, spans, trace context), and, not
// importable from outside, the engine, the mover of delayed messages and
// the one retry policy of the forwarder's own operations.
//
// # Guarantees
//
//   - At least once. A row leaves the outbox only after the destination
//     acknowledged it: Publish returned nil, or a PartialError counted it
//     among the delivered prefix of a batch. A forwarder that dies between
//     publishing and deleting publishes the row again: consumers must
//     tolerate duplicates (the inbox package is for that), unless the
//     forwarder publishes exactly once into Kafka (see Exactly once).
//   - Per-key order. Messages with the same ordering key (metadata
//     partition_key by default, see PublisherConfig.KeyMetadataField)
//     reach the destination in the order they were written: one instance
//     at a time owns a key (its partition's lease, or the slot), a key has
//     one call in flight at most, and a key whose message failed holds its
//     later messages back until that message is retried. Keys of any length
//     work. Order breaks when a message is dead-lettered (later messages of
//     its key go ahead; a requeued one arrives after them) unless dead
//     letters hold their keys (below), when forwarders disagree on
//     Polling.Partitions (the second refuses to start), or when an
//     instance is frozen inside a call for longer than its lease.
//   - Dead letters that hold their keys. With Config.DeadLetterHoldsKey, a
//     key's dead letter holds the key's later messages in the outbox until
//     an operator requeues or discards it (sqladapters/ops, millbox dead
//     requeue or discard, the admin page): requeued, it goes out first
//     under its own id and the held messages follow in order, so a
//     consumer sees 1, 2, 3, 4, never 1, 3, 4 and 2 later; discarded, the
//     key goes on with 3. Other keys keep flowing, and messages without a
//     key hold nothing. The hold is stored with the dead letter (its
//     holds column, migration 6), so every instance and a restarted one
//     see it; ops.HeldKeys, millbox dead held, the admin page and
//     MetricOutboxHeldKeys show the held keys and what waits behind them.
//     Every instance of one outbox must agree on the option. With Polling,
//     a held key costs every read a look-up in the dead letters' hold
//     index per keyed row, and its waiting rows are walked by each read
//     and keep the read floor below them (see Reading a large outbox)
//     until it is released; with cdc.Source a held key is read from the
//     table, as a key whose row failed, every cdc.Source.PollInterval
//     until it is released, so a discard takes effect within one.
//   - Independent keys. A slow, failing or hanging Publish holds back only
//     its own key: reads and calls for every other key go on while it
//     hangs, at their usual pace. PublishTimeout is the deadline of the
//     call's context, so a destination that honours it gives up then; a
//     call that has not returned by then counts as a failed attempt, and
//     its key still waits for the call to return before it moves on, so a
//     late success only duplicates a message, never reorders it. Reads stay bounded by the engine's buffer (BatchSize queued rows)
//     and, when calls of several keys stall at once, until one of them
//     ends.
//   - Retries and dead letters. A failed row is retried when Config.Retry
//     says (ExponentialRetry by default: 1 s doubling to 5 minutes,
//     ± 20%); after MaxAttempts it is dead-lettered: moved, with its last
//     error, to the outbox's table of dead letters, where
//     sqladapters/ops, the millbox command and the admin page list,
//     requeue or discard it. With the defaults a row is dead-lettered after
//     about 8.5 minutes of failures (attempts at 0, 1, 3, 7, ... 511 s).
//     When recording a failure fails itself, the forwarder logs it, holds
//     the key back for the backoff, reports it to Hooks.OnError and in
//     Status, and other keys keep flowing.
//   - Outages are one event. When the destination itself is down
//     (ErrDestinationUnavailable, a connection error, or five different
//     keys failing in a row), the forwarder stops reading and publishing and
//     probes with one message at a time (50 ms, doubling to 1 s) until the
//     destination answers. Such failures count no attempt, so an outage
//     dead-letters nothing.
//   - Lifecycle. Run returns an error when the forwarder cannot start
//     (missing tables, with how to migrate; an unreachable database; a
//     Partitions mismatch; a replication setting), and Ready returns it
//     too, so nothing waiting for the forwarder hangs. Close finishes the
//     calls in flight and the deletes of published rows within CloseTimeout
//     and hands the source over at once: partitions are released, the slot
//     is confirmed and let go.
//
// Each guarantee is a test that runs against real PostgreSQL, MariaDB,
// SQLite, the Kafka protocol, RabbitMQ, NATS and Redis: the conformance
// and fault suites of the integration module, the crash test (forwarder
// processes killed with SIGKILL while 20,000 messages flow, none lost on
// any database) and the outage tests (a broker stopped in the middle of a
// keyed stream, every key's order checked).
//
// # Destinations
//
// Config.Destination is any message.Publisher: watermill-kafka,
// watermill-amqp (v2 or v3), watermill-nats, watermill-redisstream, or
// anything else. The message's UUID, payload and metadata arrive
// unchanged, and the ordering key stored with its row is set in
// destination.KeyMetadataField (partition_key), whatever field the
// producer took it from (PublisherConfig.KeyMetadataField), so every
// destination keys by the same value; Config.Topic maps a row's topic to
// the destination's. A
// batching publisher sends several messages of a key in one round trip and
// reports, with PartialError, how many leading messages got through, so
// that no later message of a key is written after a failed one;
// forwarder/kafkabatch (franz-go, idempotent writes), forwarder/amqpbatch
// (RabbitMQ with publisher confirms) and forwarder/redisbatch (Redis
// Streams, MULTI/EXEC) are such publishers, in modules of their own.
//
// With Kafka, make the ordering key the record key so that a key stays on
// one partition: kafkabatch does by default; with watermill-kafka use
// kafka.NewWithPartitioningMarshaler returning destination.Key(msg). With
// NATS JetStream and Redis Streams, map a key to its group's subject or
// stream with Config.Topic and destination.Key. With RabbitMQ, set
// Publish.ConfirmDelivery so that a publish succeeds only once the broker
// has the message, and a ChannelPoolSize (the default opens a channel per
// publish); the durable queue config does not declare the queue on
// publish, so declare it (or start the subscriber) first. A queue keeps
// order for one consuming channel; to consume in parallel, map a key to
// its group's queue with Config.Topic and destination.Key, as for NATS.
//
// # Finding new rows
//
// An idle polling source looks at the outbox's high-water mark (the
// position of its id sequence on Postgres, the largest id on MySQL and
// SQLite: one cheap query) every Polling.WatchInterval (5 ms) and reads
// the outbox only when it moved; a Publisher in the same process wakes the
// forwarders of its outbox at once; Polling.PollInterval (1 s) finds rows
// whose retry came due. On Postgres, postgres.Options.Notify adds pg_notify to
// the outbox insert and a forwarder on pgxv5.WrapPool listens for it,
// at the price of a lock at commit (see package sqladapters/postgres). A
// forwarder checks that its notifications arrive (NotifyProbeInterval);
// when they do not (a listener behind PgBouncer in transaction pooling),
// it logs and reports ErrNotificationsLost and watches the high-water mark
// meanwhile.
//
// # Several instances
//
// Run as many forwarders as you like against one outbox: the polling
// source splits the keys into Polling.Partitions partitions, leased by
// one instance at a time, and the instances share them evenly
// (Forwarder.Partitions tells which this one holds). Each instance counts
// the live ones every quarter of Polling.PollInterval, so partitions move
// within a poll interval when an instance stops gracefully or joins, and
// after LeaseTTL
// (15 s) when one crashed. Every instance of an outbox must use the same
// Partitions; change it only with all of them stopped. With cdc.Source one
// instance streams and the others stand by.
//
// # Fleet
//
// A Forwarder serves one outbox. With an outbox per tenant — a database
// or a schema per tenant, on PostgreSQL or MySQL servers — one
// forwarder/fleet.Fleet per instance serves them all: the instances share
// the tenants by leases in a control database, a tenant's forwarder (this
// engine, with at least once, per-key order and dead letters per tenant)
// runs while the tenant has messages and lets its connections go after, a
// doorbell per server
// wakes idle tenants, and connections stay within a budget per instance
// and per server. Use it from tens of tenants on; below that, a
// Forwarder per outbox is simpler. Its cost model (connections, server
// CPU, first-message latency of an idle tenant) and its limits are in the
// fleet package's documentation.
//
// # Health
//
// Forwarder.Status reports whether the forwarder runs, its partitions, its
// last publish and last error, and the outbox's stats
// (sqladapters.OutboxStats: pending messages and the age of the oldest,
// dead letters and the keys they hold, scheduled messages and the next due
// time). HealthHandler serves /healthz and
// /readyz from it, with a JSON body that says why an instance is not
// ready.
//
// # Configuration
//
// Config, Polling, cdc.Source and PublisherConfig are passed by value; a zero field
// takes the default its documentation names (the Default constants), and
// New and NewContextPublisher call Validate, whose error names the field
// and the rule it breaks (errors.Is(err, ErrInvalidConfig)).
//
// # Exactly once
//
// With Config.ExactlyOnce and a destination that publishes in
// transactions (a TxDestination: kafkabatch.TxPublisher for Kafka), each
// outbox row appears in the destination exactly once for readers of
// committed data, in order per key, through crashes, partition moves,
// restarts and broker outages. For Kafka that means consumers with the
// read_committed isolation level:
//
//   - watermill-kafka: saramaConfig.Consumer.IsolationLevel =
//     sarama.ReadCommitted in the subscriber's OverwriteSaramaConfig;
//   - franz-go: kgo.FetchIsolationLevel(kgo.ReadCommitted()).
//
// A consumer at Kafka's default isolation also sees the messages of
// transactions that were aborted, that is duplicates and messages that
// never committed. For other destinations, and for consumers that cannot
// read committed data, the inbox (package inbox) makes processing
// effectively once instead; with an exactly-once forwarder and the inbox
// on the consuming side, a pipeline database → Kafka → database applies
// each event once.
//
// How it holds:
//
//   - One transaction per partition at a time. The ready keys of one
//     partition of the outbox (a Polling lease; with cdc.Source the
//     outbox is one partition) are published together in one destination
//     transaction, each key's messages in order; a partition has one
//     transaction in flight at most, different partitions run in
//     parallel. Each key learns the transaction's outcome as from a call
//     of its own.
//   - Fenced by the partition's holder. Before it reads any row of a
//     partition it acquired (at start, after a crash of another instance,
//     when the lease moves), a forwarder claims the partition at the
//     destination: kafkabatch initializes the partition's transactional
//     producer, whose transactional.id derives from the outbox and the
//     partition, and the broker aborts the previous holder's open
//     transaction and refuses its later commits.
//   - Progress written with the messages. Every transaction also carries
//     the ids of the partition's rows that are published and not known to
//     be removed from the outbox: its own and those of earlier
//     transactions whose delete has not completed. The claim reads the
//     last committed one (kafkabatch: a compacted control topic, read
//     with read_committed) and removes those rows before the partition
//     is read, so a crash between commit and delete publishes nothing
//     twice. A commit whose outcome is unknown (the broker went away
//     during it), a transaction another holder fenced, and published rows
//     that could not be removed make the forwarder give the partition's
//     rows back and claim it again: the claim tells what committed.
//   - Failures inside a transaction. A message the destination refuses
//     (too large, say) aborts its transaction: the other keys' messages go
//     again at once; the failing key's go in transactions of their own, one
//     message each, until the one that fails is known, which then takes
//     the ordinary path (retries with backoff, dead letter after
//     MaxAttempts). A requeued dead letter is published once, after the
//     later messages of its key as in at-least-once mode. An outage
//     pauses everything behind a probe, as above, and counts no attempt.
//   - Change data capture. The active reader of the slot claims the
//     outbox before its session reads the table. Rows the stream replays
//     from before that read, which the read may not have seen, go through
//     the table: they are published only if they are still pending.
//
// Costs and limits: a transaction per partition and one more record per
// transaction (integration/bench -case eos measures the rate against at
// least once); PublishTimeout bounds each transaction through its context,
// and the destination must return when it ends (kafkabatch ends a
// transaction at that deadline); an open transaction holds back
// read_committed consumers of the Kafka partitions it wrote until it ends,
// so after a crash they may wait until another forwarder takes the
// partition over (Polling.LeaseTTL) or the transaction times out.
//
// # Reading a large outbox
//
// The polling source reads due rows in id order. The entries of the rows
// it deleted stay in the database's index until vacuum removes them, and a
// read from the first row walks them all: tens of milliseconds per read
// after a few million rows drained between two vacuums. On Postgres
// (sqladapters.Features.Horizon) the forwarder reads past them: once per
// Polling.PollInterval a head read starts at the first row, between two looks at
// the id sequence and the oldest running transaction
// (sqladapters.Dialect.PendingHorizon), and sets a floor below which no
// row is pending or can still become visible; the reads in between start
// after it. Where a look fails (a sequence with CACHE above 1, a role that
// may not read the sequence), the forwarder logs why and reads from the
// first row. Rows handed back to the outbox (a failed attempt, a lane given
// up), rows waiting for a retry and, with Config.DeadLetterHoldsKey, dead
// letters that hold their keys lower the floor, so a key's order holds
// (a requeued dead letter and the messages its key held are read above
// it). The floor relies on each row's transaction having its
// transaction id before the row's id is drawn, which millbox's publisher
// ensures. A row inserted into the outbox table by other means, in a
// transaction that has written nothing before, could in a rare race be
// left to the next head read, up to Polling.PollInterval later, and be overtaken
// by a later row of its key.
//
// # Observability
//
// Publish stores the W3C trace context of each message's context in its
// metadata (PublisherConfig.Telemetry), so the trace of the request that
// wrote a message continues where the message is consumed. The forwarder
// records the Metric instruments and a send span per Publish call through
// the OpenTelemetry API: nothing is measured or traced, and no trace
// context read, until the application installs an SDK.
// RegisterOutboxMetrics reports the pending rows, the dead letters, the
// keys they hold and the age of the oldest pending row of an outbox as
// gauges, whether or not a forwarder runs; HealthHandler serves liveness and readiness checks from
// a StatusSource such as a Forwarder. No attribute names a message or an
// ordering key. examples/observability in the repository exports the
// metrics to Prometheus and ships a Grafana dashboard and alerts checked
// against them.
//
// # Moving from Watermill's forwarder
//
// Watermill's components/forwarder wraps messages in an envelope, stores
// them through a watermill-sql publisher on one forwarder topic, and moves
// them one message at a time with a watermill-sql subscriber. To move:
//
//  1. Create millbox's tables (sqladapters.Migrate, or the script of
//     sqladapters.MigrationSQL for a migration tool).
//  2. Replace Watermill's forwarder.NewPublisher by NewPublisher or
//     NewContextPublisher; the topic published to is the destination
//     topic, without an envelope.
//  3. Start New with the destination publisher already in use. Keep
//     Watermill's forwarder running until its SQL topic is drained, then
//     remove it.
//  4. Set the ordering key in the partition_key metadata, or point
//     PublisherConfig.KeyMetadataField at the field already in use.
package forwarder
