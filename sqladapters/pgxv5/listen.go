package pgxv5

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Option configures WrapPool.
type Option func(*DB)

type listenConfig struct {
	conn *pgx.ConnConfig
	err  error
}

// ListenOn makes the DB listen for notifications on a connection of its
// own, opened from connString (a pgx connection string, URL or key=value)
// for each subscription and closed, never pooled, when it ends. Point it
// at Postgres directly, or at PgBouncer in session pooling, when the pool
// goes through PgBouncer in transaction pooling: there a LISTEN subscribes
// whichever server connection runs it, which goes straight back to
// PgBouncer's pool, so notifications never reach the listener (and reach
// other clients of that server connection instead). An invalid connString
// makes Listen fail with the parse error.
func ListenOn(connString string) Option {
	return func(d *DB) {
		cfg, err := pgx.ParseConfig(connString)
		if err != nil {
			d.listen = listenConfig{err: fmt.Errorf("millbox: pgxv5: ListenOn: %w", err)}
			return
		}
		d.listen = listenConfig{conn: cfg}
	}
}

// ListenConfig is ListenOn with a parsed configuration, for what a
// connection string cannot carry (a dialer, TLS settings, hooks). The DB
// keeps a copy.
func ListenConfig(cfg *pgx.ConnConfig) Option {
	return func(d *DB) {
		if cfg == nil {
			d.listen = listenConfig{err: errors.New("millbox: pgxv5: ListenConfig: nil config")}
			return
		}
		d.listen = listenConfig{conn: cfg.Copy()}
	}
}

// ErrPooledListener is returned by Listen when the listener's connection
// does not keep one server session: two statements on it ran in different
// Postgres backends, as happens behind PgBouncer in transaction or
// statement pooling. Notifications cannot reach such a connection.
var ErrPooledListener = errors.New("millbox: pgxv5: the listener's connection is shared per transaction by a pooler " +
	"(PgBouncer in transaction pooling?), so notifications cannot reach it; " +
	"give it a direct or session-pooled connection with pgxv5.ListenOn")

// unlistenFor bounds the unsubscription behind a pooler, and unlistenPeel
// the server connections it holds meanwhile to reach the one that ran
// LISTEN.
const (
	unlistenFor  = 3 * time.Second
	unlistenPeel = 50
)

// Listen implements sqladapters.Listener on the connection ListenOn names,
// or else on a connection taken from the pool for good (a connection that
// listened never serves other queries), and closes it when it returns.
//
// Before closing, it unsubscribes the server session that ran LISTEN, so
// that no pooler in between keeps a subscribed server connection. When the
// connection turns out to be shared per transaction by a pooler (another
// server process answers one of its statements), Listen returns
// ErrPooledListener, then and on every later call, without calling ready.
// An error unsubscribing is returned even when ctx ended.
func (d *DB) Listen(ctx context.Context, channel string, ready, notify func()) (err error) {
	if d.pooled.Load() {
		return ErrPooledListener
	}
	c, err := d.listenConn(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	ch := pgx.Identifier{channel}.Sanitize()
	pid, err := backendPID(ctx, c, "LISTEN "+ch+"; ")
	if err != nil {
		return err
	}
	defer func() {
		if c.IsClosed() {
			return // the session ended, and its subscription with it
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlistenFor)
		defer cancel()
		pooled, uerr := unlisten(cctx, c, ch, pid)
		if pooled {
			d.pooled.Store(true)
			if !errors.Is(err, ErrPooledListener) {
				err = errors.Join(err, ErrPooledListener)
			}
		}
		err = errors.Join(err, uerr)
	}()
	// A pooler that moves a client between server connections shows as
	// another backend answering the next statement. (It may also hand
	// back the same one; the forwarder's probe covers that case.)
	again, err := backendPID(ctx, c, "")
	if err != nil {
		return err
	}
	if again != pid {
		d.pooled.Store(true)
		return ErrPooledListener
	}
	ready()
	for {
		if _, err := c.WaitForNotification(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		notify()
	}
}

func (d *DB) listenConn(ctx context.Context) (*pgx.Conn, error) {
	switch {
	case d.listen.err != nil:
		return nil, d.listen.err
	case d.listen.conn != nil:
		return pgx.ConnectConfig(ctx, d.listen.conn)
	case d.pool == nil:
		return nil, errors.New("millbox: pgxv5: a DB made by WrapConn cannot listen; use WrapPool")
	}
	conn, err := d.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return conn.Hijack(), nil
}

// backendPID runs prefix and then reads the process id of the server
// session, all in one simple-protocol message: one transaction, so a
// pooler runs it on one server connection.
func backendPID(ctx context.Context, c *pgx.Conn, prefix string) (int, error) {
	res, err := c.PgConn().Exec(ctx, prefix+"SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return 0, err
	}
	last := res[len(res)-1]
	if len(last.Rows) != 1 || len(last.Rows[0]) != 1 {
		return 0, errors.New("millbox: pgxv5: pg_backend_pid() returned no row")
	}
	return strconv.Atoi(string(last.Rows[0][0]))
}

// unlisten unsubscribes the server session pid that c ran LISTEN in. On a
// session of its own that is one statement. Behind a pooler (pooled
// reports it), the statement lands on whichever server connection is free,
// and a pooler reusing the most recently freed one (PgBouncer) hands c the
// same one again and again: so it opens transactions on connections of its
// own, each running UNLISTEN and keeping its server connection until the
// end, so that each next one gets another, until one is pid.
func unlisten(ctx context.Context, c *pgx.Conn, channel string, pid int) (pooled bool, err error) {
	unl := "UNLISTEN " + channel + "; "
	got, err := backendPID(ctx, c, unl)
	if err != nil {
		return false, fmt.Errorf("millbox: pgxv5: unsubscribing the listener: %w", err)
	}
	if got == pid {
		return false, nil
	}
	cfg := c.Config()
	var held []*pgx.Conn
	defer func() {
		for _, h := range held {
			_, _ = h.PgConn().Exec(ctx, "ROLLBACK").ReadAll()
			_ = h.Close(ctx)
		}
	}()
	for len(held) < unlistenPeel {
		h, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return true, fmt.Errorf("millbox: pgxv5: unsubscribing the listener: %w", err)
		}
		held = append(held, h)
		got, err := backendPID(ctx, h, "BEGIN; "+unl)
		if err != nil {
			return true, fmt.Errorf("millbox: pgxv5: unsubscribing the listener: %w", err)
		}
		if got == pid {
			if _, err := h.PgConn().Exec(ctx, "COMMIT").ReadAll(); err != nil {
				return true, fmt.Errorf("millbox: pgxv5: unsubscribing the listener: %w", err)
			}
			return true, nil
		}
	}
	return true, fmt.Errorf("millbox: pgxv5: the server session that ran LISTEN %s (pid %d) was not among the %d server connections reached; "+
		"a pooler may keep it subscribed", channel, pid, len(held)+1)
}
