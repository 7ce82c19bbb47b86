package emit

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/millbox/millbox/sqladapters"
)

// Version is the version of the records Encode writes.
const Version = 1

// Overhead bounds the bytes a record adds to its messages: the version,
// the topic's length and the count, and per message its flags, hash and
// four lengths.
const (
	recordOverhead  = 1 + 2*binary.MaxVarintLen64
	messageOverhead = 1 + 5*binary.MaxVarintLen64
)

// Size returns the bytes m takes in a record, besides the record's own.
func Size(m sqladapters.OutboxMessage) int {
	return messageOverhead + len(m.UUID) + len(m.Key) + len(m.Metadata) + len(m.Payload)
}

// Split cuts msgs, all of one topic, into runs whose records each take at
// most budget bytes; a message larger than the budget goes alone.
func Split(msgs []sqladapters.OutboxMessage, budget int) [][]sqladapters.OutboxMessage {
	var out [][]sqladapters.OutboxMessage
	for start := 0; start < len(msgs); {
		end, size := start, recordOverhead+len(msgs[start].Topic)
		for end < len(msgs) {
			n := Size(msgs[end])
			if end > start && size+n > budget {
				break
			}
			size += n
			end++
		}
		out = append(out, msgs[start:end])
		start = end
	}
	return out
}

// Encode writes msgs, which share their topic, as one record.
func Encode(msgs []sqladapters.OutboxMessage) []byte {
	if len(msgs) == 0 {
		return nil
	}
	size := recordOverhead + len(msgs[0].Topic)
	for _, m := range msgs {
		size += Size(m)
	}
	b := make([]byte, 0, size)
	b = append(b, Version)
	b = appendBytes(b, msgs[0].Topic)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		var flags byte
		if m.Key != "" {
			flags |= 1
		}
		b = append(b, flags)
		b = binary.AppendUvarint(b, uint64(uint32(m.KeyHash)))
		b = appendBytes(b, m.UUID)
		if m.Key != "" {
			b = appendBytes(b, m.Key)
		}
		b = appendBytes(b, m.Metadata)
		b = appendBytes(b, m.Payload)
	}
	return b
}

func appendBytes[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrVersion is returned by Decode for a record of an unknown version.
var ErrVersion = errors.New("millbox: a message of the outbox without a table has an unknown encoding version")

// ErrCorrupt is returned by Decode for a record that does not parse.
var ErrCorrupt = errors.New("millbox: a message of the outbox without a table does not parse")

// Message is a message of a record, with the id the database gave it.
type Message struct {
	sqladapters.OutboxMessage
	ID int64
}

// Decode reads a record with its ids. The messages' byte slices point
// into b.
func Decode(b []byte) ([]Message, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if b[0] != Version {
		return nil, fmt.Errorf("%w: version %d, this forwarder reads version %d: upgrade it", ErrVersion, b[0], Version)
	}
	r := reader{b: b[1:]}
	topic := string(r.bytes())
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: the record's header", ErrCorrupt)
	}
	out := make([]Message, 0, n)
	for i := uint64(0); i < n; i++ {
		var m Message
		m.Topic = topic
		flags := r.flag()
		m.KeyHash = int32(uint32(r.uvarint()))
		m.UUID = string(r.bytes())
		if flags&1 != 0 {
			m.Key = string(r.bytes())
		}
		m.Metadata = r.bytes()
		m.Payload = r.bytes()
		if r.err != nil {
			return nil, fmt.Errorf("%w: message %d of %d", ErrCorrupt, i+1, n)
		}
		out = append(out, m)
	}
	if uint64(len(r.b)) != 8*n {
		return nil, fmt.Errorf("%w: %d bytes after the last message, want %d ids", ErrCorrupt, len(r.b), n)
	}
	for i := range out {
		out[i].ID = int64(binary.BigEndian.Uint64(r.b[8*i:]))
	}
	return out, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = ErrCorrupt
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) flag() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = ErrCorrupt
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = ErrCorrupt
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}
