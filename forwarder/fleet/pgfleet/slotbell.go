package pgfleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/millbox/millbox/forwarder/fleet"
	"github.com/millbox/millbox/sqladapters/postgres"
)

const (
	// publicationPrefix starts the name of a slot doorbell's publication
	// and slot; 16 random hex digits follow.
	publicationPrefix = "millbox_fleet_"
	// lockSpace is the first key of the advisory lock a stream holds on
	// its publication's name while it lives, which tells live
	// publications from those a stopped process left.
	lockSpace = `hashtext('millbox.fleet.doorbell')`
	// statusGap spaces the positions a stream confirms, and statusEvery
	// bounds the time between two (below wal_sender_timeout).
	statusGap   = 100 * time.Millisecond
	statusEvery = 10 * time.Second
	// Tables that could not join a publication (missing, not owned) are
	// tried again after retryMin, doubling up to retryMax.
	retryMin = time.Second
	retryMax = time.Minute
)

var leftoverRe = regexp.MustCompile(`^` + publicationPrefix + `[0-9a-f]{16}$`)

// slotDoorbell rings the tenants whose outbox or scheduled table got an
// insert, from the database's change stream: one temporary logical
// replication slot (plugin pgoutput) per database of the tenants, with a
// publication of their tables that it keeps in step with Watch.Tenants
// (ALTER PUBLICATION ... ADD/DROP TABLE), named millbox_fleet_<random>
// like the slot. It rings when the inserting transaction commits.
//
// Cost: one replication connection per database (a walsender), and a
// connection for a moment when the set of tenants changes; nothing
// while idle. Logical decoding reads the whole server's WAL and decodes
// every change of its database before pgoutput filters them: about 29 ms
// of walsender CPU per MB of WAL. The slot is temporary and confirms what
// it received at once (at most statusGap later), so it holds no WAL
// while it streams and none at all once its connection is gone. Every
// instance of the fleet streams its own slot for its own tenants; one
// holder relaying the rings to the others would decode the WAL once
// rather than once per instance, and is not done yet.
//
// Needs: wal_level=logical, a role with REPLICATION that may create
// publications in the database and owns the tenants' tables (or is
// superuser), a free replication slot and WAL sender per database and
// instance. Creating a slot waits for the transactions running at that
// moment to end.
//
// What it misses: nothing committed while it streams into a table of the
// publication. It calls Gap when its stream starts, since what committed
// before is unknown; it rings a tenant when its tables joined the
// publication, for what committed before that. A tenant whose tables are
// missing (not migrated yet) or may not be added (not the owner) is
// logged and tried again with a backoff from 1 s to 1 min; meanwhile it
// rings only by the fleet's sweep. A table dropped and created again
// while watched leaves the publication unnoticed until the stream
// restarts. A process that dies leaves its publication behind (its slot
// goes with its connection): the next stream on the database drops it.
type slotDoorbell struct{ s *Server }

func newSlotDoorbell(s *Server) *slotDoorbell { return &slotDoorbell{s: s} }

// Watch implements fleet.Doorbell: a stream per database of the tenants,
// started and stopped as the tenants change. The first stream that fails
// ends the watch with its error.
func (b *slotDoorbell) Watch(ctx context.Context, w fleet.Watch) error {
	// The streams share w: one at a time calls its Gap and Tenants.
	var mu sync.Mutex
	gap, tenants := w.Gap, w.Tenants
	w.Gap = func() { mu.Lock(); defer mu.Unlock(); gap() }
	w.Tenants = func() []fleet.Tenant { mu.Lock(); defer mu.Unlock(); return tenants() }
	if w.Logger == nil {
		w.Logger = watermill.NopLogger{}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	failed := make(chan error, 1)
	streams := map[string]context.CancelFunc{}
	tick := time.NewTicker(b.s.cfg.DoorbellInterval)
	defer tick.Stop()
	for {
		want := map[string]bool{}
		for _, t := range w.Tenants() {
			want[b.s.database(t.Database)] = true
		}
		for db := range want {
			if streams[db] != nil {
				continue
			}
			sctx, stop := context.WithCancel(ctx)
			streams[db] = stop
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := b.stream(sctx, db, w)
				if sctx.Err() == nil {
					select {
					case failed <- fmt.Errorf("pgfleet: slot doorbell on database %q: %w", db, err):
					default:
					}
				}
			}()
		}
		for db, stop := range streams {
			if !want[db] {
				stop()
				delete(streams, db)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-failed:
			return err
		case <-tick.C:
		}
	}
}

// stream sets up a publication and a slot on database db, streams it
// until ctx ends or the stream fails, then drops the publication.
func (b *slotDoorbell) stream(ctx context.Context, db string, w fleet.Watch) error {
	name, err := randomName()
	if err != nil {
		return err
	}
	x := &slotStream{
		s: b.s, w: w, db: db, name: name,
		plain:  &b.s.connConfig(db, w.Dial, DoorbellSuffix).Config,
		tables: map[string]*pubTable{}, byOID: map[uint32][]string{},
		retry: map[string]*retryAt{}, pending: map[string]bool{}, names: map[string][]string{},
	}
	repl := x.plain.Copy()
	repl.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, repl)
	if err != nil {
		return fmt.Errorf("connect for replication: %w", hint(err))
	}
	x.conn = conn
	err = x.setUp(ctx)
	if err == nil {
		w.Gap()
		err = x.run(ctx)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = conn.Close(cctx)
	x.dropPublication(cctx)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// slotStream is one database's stream and publication.
type slotStream struct {
	s     *Server
	w     fleet.Watch
	db    string
	name  string         // of the publication and the slot
	plain *pgconn.Config // a connection to db for publication changes
	conn  *pgconn.PgConn // the replication connection

	tables map[string]*pubTable // in the publication, by quoted name
	byOID  map[uint32][]string  // tenants by table
	retry  map[string]*retryAt  // tables that could not join, by quoted name
	names  map[string][]string  // the watched tables of a schema

	inTx       bool            // between a transaction's Begin and Commit
	pending    map[string]bool // tenants of the transaction being received
	received   pglogrepl.LSN
	confirmed  pglogrepl.LSN
	lastStatus time.Time
	syncWait   time.Duration // after a failed change of the publication
}

// pubTable is a table of the publication.
type pubTable struct {
	oid     uint32
	tenants []string
}

// retryAt is when a table that could not join the publication is tried
// again, and the wait after that.
type retryAt struct {
	at   time.Time
	wait time.Duration
}

func randomName() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return publicationPrefix + hex.EncodeToString(b), nil
}

// setUp takes the lock on the stream's name, drops the publications of
// stopped doorbells, creates the publication (before the slot: pgoutput
// fails on a change decoded before its publication existed) and the
// slot, adds the tenants' tables and starts streaming.
func (x *slotStream) setUp(ctx context.Context) error {
	if _, err := execSimple(ctx, x.conn, `SELECT pg_advisory_lock(`+lockSpace+`, hashtext(`+literal(x.name)+`))`); err != nil {
		return err
	}
	x.dropLeftovers(ctx)
	if _, err := execSimple(ctx, x.conn, `CREATE PUBLICATION `+x.name+` WITH (publish = 'insert', publish_via_partition_root = true)`); err != nil {
		return fmt.Errorf("create publication: %w", err)
	}
	_, err := pglogrepl.CreateReplicationSlot(ctx, x.conn, x.name, "pgoutput", pglogrepl.CreateReplicationSlotOptions{
		Temporary: true, SnapshotAction: "NOEXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication,
	})
	if err != nil {
		return fmt.Errorf("create temporary replication slot: %w", hint(err))
	}
	if err := x.sync(ctx); err != nil {
		return err
	}
	err = pglogrepl.StartReplication(ctx, x.conn, x.name, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication, PluginArgs: []string{"proto_version '1'", "publication_names '" + x.name + "'"},
	})
	if err != nil {
		return fmt.Errorf("start replication: %w", err)
	}
	x.lastStatus = time.Now()
	return nil
}

// dropLeftovers drops the publications of doorbells whose connection is
// gone: nobody holds the lock on their name.
func (x *slotStream) dropLeftovers(ctx context.Context) {
	rows, err := execSimple(ctx, x.conn, `SELECT pubname FROM pg_publication WHERE pubname LIKE 'millbox\_fleet\_%'`)
	if err != nil {
		x.log("cannot list publications left behind", err)
		return
	}
	for _, r := range rows {
		name := string(r[0])
		if name == x.name || !leftoverRe.MatchString(name) {
			continue
		}
		lock := lockSpace + `, hashtext(` + literal(name) + `)`
		got, err := execSimple(ctx, x.conn, `SELECT pg_try_advisory_lock(`+lock+`)`)
		if err != nil || string(got[0][0]) != "t" {
			continue
		}
		if _, err := execSimple(ctx, x.conn, `DROP PUBLICATION IF EXISTS `+name); err != nil {
			x.log("cannot drop a publication left behind", err, "publication", name)
		}
		_, _ = execSimple(ctx, x.conn, `SELECT pg_advisory_unlock(`+lock+`)`)
	}
}

// dropPublication drops the stream's publication on a connection of its
// own: the replication connection is closed by then.
func (x *slotStream) dropPublication(ctx context.Context) {
	conn, err := pgconn.ConnectConfig(ctx, x.plain)
	if err == nil {
		_, err = execSimple(ctx, conn, `DROP PUBLICATION IF EXISTS `+x.name)
		_ = conn.Close(ctx)
	}
	if err != nil {
		x.log("cannot drop the publication; the next slot doorbell on the database drops it", err)
	}
}

// run receives the stream until ctx ends or it fails, looking at the
// tenants every DoorbellInterval. A change of the publication that fails
// is tried again with a backoff from 1 s to 1 min.
func (x *slotStream) run(ctx context.Context) error {
	interval := x.s.cfg.DoorbellInterval
	next := time.Now().Add(interval)
	for {
		if now := time.Now(); !now.Before(next) {
			next = now.Add(interval)
			if err := x.syncApart(ctx); err != nil && ctx.Err() == nil {
				// The stream goes on for the tenants it has.
				x.syncWait = min(max(2*x.syncWait, retryMin), retryMax)
				next = now.Add(x.syncWait)
				x.log("cannot change the publication; tried again later", err, "retry_in", x.syncWait)
			} else {
				x.syncWait = 0
			}
		}
		if err := x.status(false); err != nil {
			return err
		}
		deadline := x.lastStatus.Add(statusEvery)
		if x.received > x.confirmed {
			deadline = x.lastStatus.Add(statusGap)
		}
		if next.Before(deadline) {
			deadline = next
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := x.conn.ReceiveMessage(rctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case pgconn.Timeout(err):
			continue
		case err != nil:
			return fmt.Errorf("replication stream: %w", err)
		}
		switch msg := msg.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication stream: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyData:
			if err := x.onCopyData(msg.Data); err != nil {
				return err
			}
		}
	}
}

func (x *slotStream) onCopyData(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		k, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("keepalive: %w", err)
		}
		if !x.inTx {
			x.received = max(x.received, k.ServerWALEnd)
		}
		return x.status(k.ReplyRequested)
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("xlog data: %w", err)
		}
		m, err := pglogrepl.Parse(xld.WALData)
		if err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		switch m := m.(type) {
		case *pglogrepl.BeginMessage:
			x.inTx = true
		case *pglogrepl.InsertMessage:
			for _, id := range x.byOID[m.RelationID] {
				x.pending[id] = true
			}
		case *pglogrepl.CommitMessage:
			for id := range x.pending {
				x.w.Ring(id)
			}
			clear(x.pending)
			x.inTx = false
			x.received = max(x.received, m.TransactionEndLSN)
		}
	}
	return nil
}

// status confirms what was received: at once when the server asks,
// otherwise at most every statusGap, and every statusEvery regardless.
func (x *slotStream) status(now bool) error {
	since := time.Since(x.lastStatus)
	if !now && since < statusEvery && (x.received <= x.confirmed || since < statusGap) {
		return nil
	}
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), x.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: x.received, WALFlushPosition: x.received, WALApplyPosition: x.received,
	})
	if err != nil {
		return fmt.Errorf("send status: %w", err)
	}
	x.confirmed, x.lastStatus = x.received, time.Now()
	return nil
}

// syncApart brings the publication in step with the tenants through a
// connection of its own (the replication connection streams), opened
// only when something changes, and rings the tenants whose tables joined.
func (x *slotStream) syncApart(ctx context.Context) error {
	add, drop := x.changes()
	if len(add) == 0 && len(drop) == 0 {
		return nil
	}
	conn, err := pgconn.ConnectConfig(ctx, x.plain)
	if err != nil {
		return fmt.Errorf("connect to change the publication: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	return x.apply(ctx, conn, add, drop, true)
}

// sync brings the publication in step with the tenants on the
// replication connection, before the stream starts.
func (x *slotStream) sync(ctx context.Context) error {
	add, drop := x.changes()
	return x.apply(ctx, x.conn, add, drop, false)
}

// changes compares the publication with the tenants of the database:
// the tables to add (but those waiting for a retry) with their tenants,
// and the tables to drop. Tenants of tables kept are updated.
func (x *slotStream) changes() (add map[string][]string, drop []string) {
	want := map[string][]string{}
	for _, t := range x.w.Tenants() {
		if x.s.database(t.Database) != x.db {
			continue
		}
		for _, table := range x.watched(t.Schema) {
			want[table] = append(want[table], t.ID)
		}
	}
	now := time.Now()
	add = map[string][]string{}
	for table, ids := range want {
		if p := x.tables[table]; p != nil {
			p.tenants = ids
			x.byOID[p.oid] = ids
		} else if r := x.retry[table]; r == nil || !now.Before(r.at) {
			add[table] = ids
		}
	}
	for table := range x.tables {
		if want[table] == nil {
			drop = append(drop, table)
		}
	}
	for table := range x.retry {
		if want[table] == nil {
			delete(x.retry, table)
		}
	}
	return add, drop
}

// apply drops and adds tables on conn. A table that cannot be dropped is
// gone already; one that cannot be added waits for a retry.
func (x *slotStream) apply(ctx context.Context, conn *pgconn.PgConn, add map[string][]string, drop []string, ring bool) error {
	if len(drop) > 0 {
		if _, err := execSimple(ctx, conn, `ALTER PUBLICATION `+x.name+` DROP TABLE `+strings.Join(drop, ", ")); err != nil {
			for _, table := range drop {
				_, _ = execSimple(ctx, conn, `ALTER PUBLICATION `+x.name+` DROP TABLE `+table)
			}
		}
		for _, table := range drop {
			delete(x.byOID, x.tables[table].oid)
			delete(x.tables, table)
		}
	}
	if len(add) == 0 {
		return nil
	}
	names := make([]string, 0, len(add))
	for table := range add {
		names = append(names, literal(table))
	}
	rows, err := execSimple(ctx, conn, `SELECT t, to_regclass(t)::oid FROM unnest(ARRAY[`+strings.Join(names, ", ")+`]::text[]) AS t`)
	if err != nil {
		return fmt.Errorf("look up the tenants' tables: %w", err)
	}
	found := map[string]uint32{}
	for _, r := range rows {
		if r[1] != nil {
			oid, err := strconv.ParseUint(string(r[1]), 10, 32)
			if err != nil {
				return fmt.Errorf("look up the tenants' tables: oid %q: %w", r[1], err)
			}
			found[string(r[0])] = uint32(oid)
		}
	}
	var ok []string
	for table := range add {
		if _, exists := found[table]; exists {
			ok = append(ok, table)
		} else {
			x.later(table, nil)
		}
	}
	if len(ok) == 0 {
		return nil
	}
	joined := ok
	if _, err := execSimple(ctx, conn, `ALTER PUBLICATION `+x.name+` ADD TABLE `+strings.Join(ok, ", ")); err != nil {
		joined = nil
		for _, table := range ok {
			if _, err := execSimple(ctx, conn, `ALTER PUBLICATION `+x.name+` ADD TABLE `+table); err != nil {
				x.later(table, err)
				continue
			}
			joined = append(joined, table)
		}
	}
	rung := map[string]bool{}
	for _, table := range joined {
		delete(x.retry, table)
		p := &pubTable{oid: found[table], tenants: add[table]}
		x.tables[table], x.byOID[p.oid] = p, p.tenants
		for _, id := range p.tenants {
			if ring && !rung[id] {
				rung[id] = true
				x.w.Ring(id)
			}
		}
	}
	return nil
}

// watched returns the quoted names of the tables of a tenant in schema
// that ring: its outbox and its scheduled table. A schema that is no
// valid name has none (the fleet cannot make its dialect either).
func (x *slotStream) watched(schema string) []string {
	names, ok := x.names[schema]
	if !ok {
		opts := x.s.cfg.Options
		opts.Schema = schema
		if d, err := postgres.New(opts); err == nil {
			// Tables lists the scheduled table last.
			tables := d.Tables()
			names = []string{d.OutboxTable(), tables[len(tables)-1]}
		}
		x.names[schema] = names
	}
	return names
}

// later schedules another try of a table that could not join (err), or
// does not exist yet (err nil: a tenant not migrated yet, which is
// logged at info level).
func (x *slotStream) later(table string, err error) {
	r := x.retry[table]
	if r == nil {
		r = &retryAt{wait: retryMin}
		x.retry[table] = r
	} else {
		r.wait = min(2*r.wait, retryMax)
	}
	r.at = time.Now().Add(r.wait)
	fields := x.fields("table", table, "retry_in", r.wait)
	if err == nil {
		x.w.Logger.Info("pgfleet: slot doorbell: a tenant's table does not exist (yet); tried again later", fields)
		return
	}
	x.w.Logger.Error("pgfleet: slot doorbell: a tenant's table cannot join the doorbell's publication; tried again later", err, fields)
}

func (x *slotStream) log(msg string, err error, kv ...any) {
	x.w.Logger.Error("pgfleet: slot doorbell: "+msg, err, x.fields(kv...))
}

func (x *slotStream) fields(kv ...any) watermill.LogFields {
	fields := watermill.LogFields{"database": x.db, "publication": x.name}
	for i := 0; i+1 < len(kv); i += 2 {
		fields[fmt.Sprint(kv[i])] = kv[i+1]
	}
	return fields
}

// execSimple executes sql (one statement or several, simple protocol, as
// a replication connection allows) and returns the rows of the last.
func execSimple(ctx context.Context, conn *pgconn.PgConn, sql string) ([][][]byte, error) {
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(res) == 0 {
		return nil, nil
	}
	return res[len(res)-1].Rows, nil
}

// literal quotes s as an SQL string literal. The names it quotes are
// validated identifiers already; doubling quotes keeps it safe anyway.
func literal(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// hint adds what the slot doorbell needs to the errors of a server that
// does not give it.
func hint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "55000" || pe.Code == "42501") {
		return fmt.Errorf("%w (the slot doorbell needs wal_level=logical and a role with REPLICATION)", err)
	}
	return err
}
