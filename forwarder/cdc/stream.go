package cdc

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/millbox/millbox/forwarder/cdc/internal/pgoutput"
)

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
	s         *streamer
	sess      *session
	confirmed *atomic.Uint64 // set by the session
	received  pglogrepl.LSN

	dec      *pgoutput.Decoder
	lastSent time.Time
}

func (r *reader) run(ctx context.Context) error {
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
func (r *reader) emit(ctx context.Context, ev pgoutput.Event) error {
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
			r.received = max(r.received, ev.End)
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
		if !r.dec.InTx() && pkm.ServerWALEnd > r.received {
			if err := r.emit(ctx, pgoutput.Event{End: pkm.ServerWALEnd}); err != nil {
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
	ev, err := r.dec.Message(data)
	if err != nil || ev == nil {
		return err
	}
	return r.emit(ctx, *ev)
}
