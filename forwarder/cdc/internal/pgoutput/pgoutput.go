package pgoutput

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/millbox/millbox/forwarder/internal/emit"
	"github.com/millbox/millbox/sqladapters"
)

// Row is an outbox row decoded from the stream, or a message of a
// publisher without a table (Emitted).
type Row struct {
	sqladapters.OutboxRow
	Keyed    bool // Key holds an ordering key (else the row has none)
	Requeued bool // a dead letter moved back into the outbox (requeued_at is set)
	Emitted  bool // in no table; ID is the one it was emitted with
	KeyHash  int32
}

// Requeue is a dead letter moved back into the outbox: an insert under
// its old id, which polling publishes ahead of its key's later rows.
type Requeue struct {
	ID    int64
	Key   string
	Keyed bool
}

// Event is one committed transaction of the stream, or a keepalive
// position (Rows and Requeues empty), in stream order.
type Event struct {
	Rows     []*Row
	Requeues []Requeue
	XID      uint32
	End      pglogrepl.LSN // the end of the commit record, or the keepalive's position
	Commit   time.Time
	Emitted  bool // it holds messages of a publisher without a table
	// Emits is the highest number of a call without a table in it (0:
	// none, or only calls of publishers that number none).
	Emits int64
}

// Decoder turns the stream's messages into transactions of the outbox.
type Decoder struct {
	oid    uint32 // the outbox table
	prefix string // of its logical decoding messages
	rel    map[uint32]*relation
	inTx   bool
	cur    Event
}

// NewDecoder decodes the stream of the outbox table oid, whose publishers
// without a table write logical decoding messages with prefix.
func NewDecoder(oid uint32, prefix string) *Decoder {
	return &Decoder{oid: oid, prefix: prefix, rel: map[uint32]*relation{}}
}

// InTx tells whether a transaction is being decoded: a keepalive's
// position then says nothing of what is complete.
func (d *Decoder) InTx() bool { return d.inTx }

// Message decodes one message of the stream (the WAL data of an XLogData
// message) and returns the transaction it completed, nil while none did.
func (d *Decoder) Message(data []byte) (*Event, error) {
	m, err := pglogrepl.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("millbox cdc: decode: %w", err)
	}
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		d.rel[m.RelationID] = d.relation(m)
	case *pglogrepl.BeginMessage:
		d.inTx = true
		d.cur = Event{XID: m.Xid, Commit: m.CommitTime}
	case *pglogrepl.InsertMessage:
		rel := d.rel[m.RelationID]
		if rel == nil || !rel.ours {
			return nil, nil
		}
		row, err := decodeRow(rel, m.Tuple)
		if err != nil {
			return nil, err
		}
		if row.Requeued {
			d.cur.Requeues = append(d.cur.Requeues, Requeue{ID: row.ID, Key: row.Key, Keyed: row.Keyed})
		} else {
			d.cur.Rows = append(d.cur.Rows, row)
		}
	case *pglogrepl.LogicalDecodingMessage:
		if !m.Transactional || !d.inTx {
			return nil, nil // not part of a transaction: never ours
		}
		if m.Prefix == d.prefix+sqladapters.EmitCountSuffix {
			if len(m.Content) == 8 {
				d.cur.Emits = max(d.cur.Emits, int64(binary.BigEndian.Uint64(m.Content)))
			}
			return nil, nil
		}
		if m.Prefix != d.prefix {
			return nil, nil // another's
		}
		// The content points into the connection's read buffer, which the
		// next message overwrites: the messages keep a copy.
		msgs, err := emit.Decode(bytes.Clone(m.Content))
		if err != nil {
			// Skipping it would lose its messages; stop here, and say so
			// at every start, until the forwarder can read it.
			return nil, fmt.Errorf("millbox cdc: at %v: %w", m.LSN, err)
		}
		d.cur.Emitted = true
		for _, em := range msgs {
			row := &Row{Keyed: em.Key != "", Emitted: true, KeyHash: em.KeyHash}
			row.ID, row.Topic, row.UUID, row.Payload, row.Metadata, row.Key = em.ID, em.Topic, em.UUID, em.Payload, em.Metadata, em.Key
			d.cur.Rows = append(d.cur.Rows, row)
		}
	case *pglogrepl.CommitMessage:
		d.inTx = false
		d.cur.End = m.TransactionEndLSN
		ev := d.cur
		d.cur = Event{}
		return &ev, nil
	}
	return nil, nil
}

// relation maps the outbox's columns to their positions.
type relation struct {
	ours                                                        bool
	id, topic, uuid, payload, metadata, key, attempts, requeued int
}

func (d *Decoder) relation(m *pglogrepl.RelationMessage) *relation {
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
	rel.ours = m.RelationID == d.oid && rel.id >= 0 && rel.topic >= 0 && rel.uuid >= 0 &&
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

func decodeRow(rel *relation, t *pglogrepl.TupleData) (*Row, error) {
	row := &Row{}
	id, ok := intOf(t, rel.id)
	if !ok {
		return nil, fmt.Errorf("%w: no id", errTuple)
	}
	row.ID = id
	row.Topic, _ = textOf(t, rel.topic)
	row.UUID, _ = textOf(t, rel.uuid)
	row.Metadata, _ = jsonOf(t, rel.metadata)
	row.Key, row.Keyed = textOf(t, rel.key)
	if a, ok := intOf(t, rel.attempts); ok {
		row.Attempts = int(a)
	}
	if row.Payload, ok = bytesOf(t, rel.payload); !ok {
		return nil, fmt.Errorf("%w: payload of row %d is not bytea", errTuple, id)
	}
	row.Requeued = column(t, rel.requeued) != nil && !isNull(t, rel.requeued)
	return row, nil
}
