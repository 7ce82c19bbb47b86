package cdc

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/millbox/millbox/forwarder/internal/emit"
	"github.com/millbox/millbox/sqladapters"
)

// streamRow is an outbox row decoded from the stream, or a message of a
// publisher without a table (emitted).
type streamRow struct {
	sqladapters.OutboxRow
	keyed    bool // Key holds an ordering key (else the row has none)
	requeued bool // a dead letter moved back into the outbox (requeued_at is set)
	emitted  bool // in no table; ID is the one it was emitted with
	keyHash  int32
}

// requeue is a dead letter moved back into the outbox: an insert under
// its old id, which polling publishes ahead of its key's later rows.
type requeue struct {
	id    int64
	key   string
	keyed bool
}

// streamEvent is one committed transaction of the stream, or a keepalive
// position (rows and requeues empty), in stream order.
type streamEvent struct {
	rows     []*streamRow
	requeues []requeue
	xid      uint32
	end      pglogrepl.LSN // the end of the commit record, or the keepalive's position
	commit   time.Time
}

// connect opens a replication connection and tries to take the
// leadership lock on it; the lock lives as long as the connection.
func connect(ctx context.Context, cfg *Source) (conn *pgconn.PgConn, leader bool, err error) {
	pc, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return nil, false, fmt.Errorf("millbox cdc: parse Config.ConnString: %w", err)
	}
	pc.RuntimeParams["replication"] = "database"
	pc.RuntimeParams["application_name"] = "millbox_cdc_" + cfg.Slot
	conn, err = pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return nil, false, explain(err)
	}
	// The slot name is a validated identifier: safe inline.
	res, err := conn.Exec(ctx, `SELECT pg_try_advisory_lock(hashtext('millbox.cdc'), hashtext('`+cfg.Slot+`'))`).ReadAll()
	if err != nil {
		conn.Close(context.Background())
		return nil, false, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "t" {
		conn.Close(context.Background())
		return nil, false, nil
	}
	return conn, true, nil
}

// startReplication starts streaming from the slot's confirmed position,
// retrying while the slot is still held by a previous reader (whose
// backend may take a moment to go after its connection died).
func startReplication(ctx context.Context, conn *pgconn.PgConn, cfg *Source, messages bool) error {
	args := []string{"proto_version '1'", "publication_names '" + cfg.Publication + "'", "binary 'true'"}
	if messages {
		// The logical decoding messages of publishers without a table.
		args = append(args, "messages 'true'")
	}
	for {
		err := pglogrepl.StartReplication(ctx, conn, cfg.Slot, 0, pglogrepl.StartReplicationOptions{
			Mode:       pglogrepl.LogicalReplication,
			PluginArgs: args,
		})
		if err == nil {
			return nil
		}
		if sqlState(err) != "55006" { // object_in_use: the slot is active for another process
			return fmt.Errorf("millbox cdc: start replication: %w", explain(err))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// reader decodes the stream into events for its session and reports
// positions to the server. It owns the connection while it runs.
type reader struct {
	conn      *pgconn.PgConn
	cfg       *Source
	oid       uint32 // the outbox table
	prefix    string // of its logical decoding messages
	s         *streamer
	sess      *session
	confirmed *atomic.Uint64 // set by the session
	received  pglogrepl.LSN

	rel      map[uint32]*relation
	inTx     bool
	cur      streamEvent
	lastSent time.Time
}

// relation maps the outbox's columns to their positions.
type relation struct {
	ours                                                        bool
	id, topic, uuid, payload, metadata, key, attempts, requeued int
}

func (r *reader) run(ctx context.Context) error {
	r.rel = map[uint32]*relation{}
	for {
		if time.Since(r.lastSent) >= r.cfg.StatusInterval {
			if err := r.sendStatus(); err != nil {
				return err
			}
		}
		rctx, cancel := context.WithDeadline(ctx, r.lastSent.Add(r.cfg.StatusInterval))
		msg, err := r.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("millbox cdc: replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("millbox cdc: replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if err := r.onCopyData(ctx, msg.Data); err != nil {
				return err
			}
		}
	}
}

func (r *reader) sendStatus() error {
	flush := pglogrepl.LSN(r.confirmed.Load())
	write := max(r.received, flush)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), r.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: flush, WALApplyPosition: flush,
	})
	r.lastSent = time.Now()
	if err != nil {
		return fmt.Errorf("millbox cdc: send status: %w", err)
	}
	return nil
}

// emit hands an event to the session through the engine's feed,
// reporting status meanwhile: the engine holds the stream back while its
// buffers are full.
func (r *reader) emit(ctx context.Context, ev streamEvent) error {
	s, sess := r.s, r.sess
	fn := func() {
		if s.sess == sess {
			sess.onStream(ev)
		}
	}
	for {
		wait := time.Until(r.lastSent.Add(r.cfg.StatusInterval))
		t := time.NewTimer(max(wait, 0))
		select {
		case s.feed <- fn:
			t.Stop()
			r.received = max(r.received, ev.end)
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
			if err := r.sendStatus(); err != nil {
				return err
			}
		}
	}
}

func (r *reader) onCopyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("millbox cdc: keepalive: %w", err)
		}
		if !r.inTx && pkm.ServerWALEnd > r.received {
			if err := r.emit(ctx, streamEvent{end: pkm.ServerWALEnd}); err != nil {
				return err
			}
		}
		if pkm.ReplyRequested {
			return r.sendStatus()
		}
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("millbox cdc: xlog data: %w", err)
		}
		return r.onMessage(ctx, xld.WALData)
	}
	return nil
}

func (r *reader) onMessage(ctx context.Context, data []byte) error {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("millbox cdc: decode: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		r.rel[m.RelationID] = r.relation(m)
	case *pglogrepl.BeginMessage:
		r.inTx = true
		r.cur = streamEvent{xid: m.Xid, commit: m.CommitTime}
	case *pglogrepl.InsertMessage:
		rel := r.rel[m.RelationID]
		if rel == nil || !rel.ours {
			return nil
		}
		row, err := decodeRow(rel, m.Tuple)
		if err != nil {
			return err
		}
		if row.requeued {
			r.cur.requeues = append(r.cur.requeues, requeue{id: row.ID, key: row.Key, keyed: row.keyed})
		} else {
			r.cur.rows = append(r.cur.rows, row)
		}
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional || m.Prefix != r.prefix || !r.inTx {
			return nil // another's, or not part of a transaction: never ours
		}
		// The content points into the connection's read buffer, which the
		// next message overwrites: the messages keep a copy.
		if r.cfg.TableOnly {
			return fmt.Errorf("millbox cdc: at %v: a publisher without a table wrote to the outbox, but cdc.Source.TableOnly is set: unset it, or the key's order could not be kept", m.LSN)
		}
		msgs, err := emit.Decode(bytes.Clone(m.Content))
		if err != nil {
			// Skipping it would lose its messages; stop here, and say so
			// at every start, until the forwarder can read it.
			return fmt.Errorf("millbox cdc: at %v: %w", m.LSN, err)
		}
		for _, em := range msgs {
			row := &streamRow{keyed: em.Key != "", emitted: true, keyHash: em.KeyHash}
			row.ID, row.Topic, row.UUID, row.Payload, row.Metadata, row.Key = em.ID, em.Topic, em.UUID, em.Payload, em.Metadata, em.Key
			r.cur.rows = append(r.cur.rows, row)
		}
	case *pglogrepl.CommitMessage:
		r.inTx = false
		r.cur.end = m.TransactionEndLSN
		ev := r.cur
		r.cur = streamEvent{}
		return r.emit(ctx, ev)
	}
	return nil
}

func (r *reader) relation(m *pglogrepl.RelationMessage) *relation {
	rel := &relation{id: -1, topic: -1, uuid: -1, payload: -1, metadata: -1, key: -1, attempts: -1, requeued: -1}
	for i, c := range m.Columns {
		switch c.Name {
		case "id":
			rel.id = i
		case "topic":
			rel.topic = i
		case "uuid":
			rel.uuid = i
		case "payload":
			rel.payload = i
		case "metadata":
			rel.metadata = i
		case "key":
			rel.key = i
		case "attempts":
			rel.attempts = i
		case "requeued_at":
			rel.requeued = i
		}
	}
	rel.ours = m.RelationID == r.oid && rel.id >= 0 && rel.topic >= 0 && rel.uuid >= 0 &&
		rel.payload >= 0 && rel.metadata >= 0 && rel.key >= 0 && rel.attempts >= 0 && rel.requeued >= 0
	return rel
}

var errTuple = errors.New("millbox cdc: unexpected tuple")

func column(t *pglogrepl.TupleData, i int) *pglogrepl.TupleDataColumn {
	if t == nil || i < 0 || i >= len(t.Columns) {
		return nil
	}
	return t.Columns[i]
}

// textOf returns a text or jsonb column's value; binary jsonb starts with
// its format version (1) before the JSON text.
func textOf(t *pglogrepl.TupleData, i int) (string, bool) {
	c := column(t, i)
	if c == nil {
		return "", false
	}
	switch c.DataType {
	case pglogrepl.TupleDataTypeText, pglogrepl.TupleDataTypeBinary:
		return string(c.Data), true
	}
	return "", false
}

func jsonOf(t *pglogrepl.TupleData, i int) ([]byte, bool) {
	c := column(t, i)
	switch {
	case c == nil:
		return nil, false
	case c.DataType == pglogrepl.TupleDataTypeText:
		return c.Data, true
	case c.DataType == pglogrepl.TupleDataTypeBinary && len(c.Data) > 0 && c.Data[0] == 1:
		return c.Data[1:], true
	}
	return nil, false
}

// intOf returns an integer column's value, sent as binary int2/int4/int8
// or as text.
func intOf(t *pglogrepl.TupleData, i int) (int64, bool) {
	c := column(t, i)
	if c == nil {
		return 0, false
	}
	switch c.DataType {
	case pglogrepl.TupleDataTypeBinary:
		switch len(c.Data) {
		case 2:
			return int64(int16(binary.BigEndian.Uint16(c.Data))), true
		case 4:
			return int64(int32(binary.BigEndian.Uint32(c.Data))), true
		case 8:
			return int64(binary.BigEndian.Uint64(c.Data)), true
		}
	case pglogrepl.TupleDataTypeText:
		v, err := strconv.ParseInt(string(c.Data), 10, 64)
		return v, err == nil
	}
	return 0, false
}

// bytesOf returns a bytea column's value: raw in binary, hex in text.
func bytesOf(t *pglogrepl.TupleData, i int) ([]byte, bool) {
	c := column(t, i)
	if c == nil {
		return nil, false
	}
	switch c.DataType {
	case pglogrepl.TupleDataTypeBinary:
		return c.Data, true
	case pglogrepl.TupleDataTypeText:
		if len(c.Data) < 2 || c.Data[0] != '\\' || c.Data[1] != 'x' {
			return nil, false
		}
		b := make([]byte, hex.DecodedLen(len(c.Data)-2))
		if _, err := hex.Decode(b, c.Data[2:]); err != nil {
			return nil, false
		}
		return b, true
	}
	return nil, false
}

func isNull(t *pglogrepl.TupleData, i int) bool {
	c := column(t, i)
	return c != nil && c.DataType == pglogrepl.TupleDataTypeNull
}

func decodeRow(rel *relation, t *pglogrepl.TupleData) (*streamRow, error) {
	row := &streamRow{}
	id, ok := intOf(t, rel.id)
	if !ok {
		return nil, fmt.Errorf("%w: no id", errTuple)
	}
	row.ID = id
	row.Topic, _ = textOf(t, rel.topic)
	row.UUID, _ = textOf(t, rel.uuid)
	row.Metadata, _ = jsonOf(t, rel.metadata)
	row.Key, row.keyed = textOf(t, rel.key)
	if a, ok := intOf(t, rel.attempts); ok {
		row.Attempts = int(a)
	}
	if row.Payload, ok = bytesOf(t, rel.payload); !ok {
		return nil, fmt.Errorf("%w: payload of row %d is not bytea", errTuple, id)
	}
	row.requeued = column(t, rel.requeued) != nil && !isNull(t, rel.requeued)
	return row, nil
}
