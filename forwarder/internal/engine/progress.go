package engine

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// The progress a transaction carries (TxDestination.PublishTx) lists the
// rows of its partition that are published and not known to be removed
// from the outbox: the rows of the transaction itself and those of
// earlier transactions whose delete has not been confirmed. Whoever claims
// the partition next removes them before it reads the outbox, so a row
// published and then left in the table by a crash is not published again.
//
// Format: the magic "mbp1", the number of rows (uvarint), then for each
// row in id order the difference to the previous id (uvarint, from 0) and
// the transaction id that wrote it when a replication stream saw it before
// it was visible (uvarint, 0 otherwise).

var progressMagic = []byte("mbp1")

// progressRow is a row a progress record lists.
type progressRow struct {
	id  int64
	xid uint32
}

// encodeProgress encodes the rows of published and extra.
func encodeProgress(published map[int64]uint32, extra []progressRow) []byte {
	rows := make([]progressRow, 0, len(published)+len(extra))
	for id, xid := range published {
		rows = append(rows, progressRow{id, xid})
	}
	rows = append(rows, extra...)
	slices.SortFunc(rows, func(a, b progressRow) int { return cmp.Compare(a.id, b.id) })
	rows = slices.CompactFunc(rows, func(a, b progressRow) bool { return a.id == b.id })
	b := make([]byte, 0, len(progressMagic)+binary.MaxVarintLen64+len(rows)*4)
	b = append(b, progressMagic...)
	b = binary.AppendUvarint(b, uint64(len(rows)))
	var prev int64
	for _, r := range rows {
		b = binary.AppendUvarint(b, uint64(r.id-prev))
		b = binary.AppendUvarint(b, uint64(r.xid))
		prev = r.id
	}
	return b
}

var errBadProgress = errors.New("millbox: malformed progress record")

// decodeProgress decodes what encodeProgress wrote; empty means none.
func decodeProgress(b []byte) ([]progressRow, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if len(b) < len(progressMagic) || string(b[:len(progressMagic)]) != string(progressMagic) {
		return nil, fmt.Errorf("%w: it does not start with %q (was it written by millbox?)", errBadProgress, progressMagic)
	}
	b = b[len(progressMagic):]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: bad row count", errBadProgress)
	}
	b = b[k:]
	rows := make([]progressRow, 0, n)
	var prev int64
	for range n {
		d, k1 := binary.Uvarint(b)
		if k1 <= 0 {
			return nil, fmt.Errorf("%w: truncated", errBadProgress)
		}
		x, k2 := binary.Uvarint(b[k1:])
		if k2 <= 0 || x > 1<<32-1 {
			return nil, fmt.Errorf("%w: truncated", errBadProgress)
		}
		b = b[k1+k2:]
		prev += int64(d)
		rows = append(rows, progressRow{id: prev, xid: uint32(x)})
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the rows", errBadProgress, len(b))
	}
	return rows, nil
}
