package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// FleetBuilder builds the SQL of one database for a fleet's control
// tables (sqladapters.FleetStore). It never executes anything.
//
// A member is live while its expires_at is after the database's clock; a
// tenant's live owner is its owner when that owner has a live member row.
// A method given a list of tenant IDs gets at most IDsPerStatement of
// them (any number when that is 0), never none.
type FleetBuilder interface {
	Migrator
	// Name is a short name of the database, such as "postgres".
	Name() string
	// ClassifyError maps a driver error to millbox's errors, as
	// Builder.ClassifyError does.
	ClassifyError(err error) error
	// RetryConflict tells that err, which ended a transaction of the
	// store's own, was a conflict with a concurrent transaction that the
	// database resolved by rolling this one back (a deadlock): the store
	// runs the transaction again.
	RetryConflict(err error) bool
	// Tables returns the quoted, qualified names of the control tables.
	Tables() []string
	// Migrations lists every migration in version order.
	Migrations() []sqladapters.Migration
	// CreateSchema creates the schema (PostgreSQL) or database (MySQL)
	// the table names are qualified with, when they are; none otherwise.
	CreateSchema() []sqladapters.Query
	// ScriptNote is a line for the head of the migration script: whether
	// its statements may run again.
	ScriptNote() string
	// Savepoint returns the statements that set a savepoint, roll back to
	// it and release it; false where the database has none.
	Savepoint() (set, rollback, release sqladapters.Query, ok bool)
	// IDsPerStatement bounds the tenant IDs one statement is given; 0
	// where one parameter carries any number.
	IDsPerStatement() int
	// BeginWrite returns a statement that writes nothing but makes the
	// transaction a writer, for the store's transactions that read before
	// they write, where a transaction that did not write first cannot
	// wait for the write lock (SQLite's deferred transactions); false
	// elsewhere.
	BeginWrite() (sqladapters.Query, bool)

	// RenewMember extends the member row of instance to ttl from now
	// where it is live. It affects that one row, also when the new expiry
	// equals the old, and none when the row is missing or expired.
	RenewMember(instance string, ttl time.Duration) sqladapters.Query
	// JoinMember writes the member row of instance, live for ttl, whether
	// one exists or not.
	JoinMember(instance string, ttl time.Duration) sqladapters.Query
	// LiveMembers selects the names of the live members (one column).
	LiveMembers() sqladapters.Query
	// RemoveMember deletes the member row of instance.
	RemoveMember(instance string) sqladapters.Query
	// ReleaseAll clears the owner of every tenant of instance.
	ReleaseAll(instance string) sqladapters.Query
	// DeleteOwnedRemoved deletes the removed tenants of instance.
	DeleteOwnedRemoved(instance string) sqladapters.Query

	// CatalogVersion selects the catalog version: one row, one bigint.
	CatalogVersion() sqladapters.Query
	// BumpVersion adds one to the catalog version.
	BumpVersion() sqladapters.Query
	// SelectTenants selects every tenant's ID, server, database, schema,
	// whether it is removed, and its live owner (NULL when none).
	SelectTenants() sqladapters.Query
	// OwnedTenants selects ID, server, database, schema and whether it is
	// removed of the tenants instance owns; none unless instance is live.
	OwnedTenants(instance string) sqladapters.Query
	// LockTenants selects ID, server, database, schema and whether it is
	// removed of the tenants ids, locking them, in ID order, where the
	// database has row locks.
	LockTenants(ids []string) sqladapters.Query
	// InsertTenants writes ts (at least one), which LockTenants did not
	// find, neither removed nor owned: an upsert where the database has
	// one that a concurrent put of the same tenant turns into an update, a
	// plain insert otherwise (the store runs its own transaction again
	// after a duplicate key).
	InsertTenants(ts []sqladapters.FleetTenant) []sqladapters.Query
	// UpdateTenant sets the server, database and schema of t and clears
	// its removal, keeping its owner.
	UpdateTenant(t sqladapters.FleetTenant) sqladapters.Query
	// MarkRemoved marks removed those of the tenants ids that are not,
	// affecting the rows it marks.
	MarkRemoved(ids []string) sqladapters.Query
	// DeleteUnowned deletes those of the tenants ids that are removed and
	// have no live owner.
	DeleteUnowned(ids []string) sqladapters.Query
	// DeleteRemoved deletes those of the tenants ids that are removed and
	// owned by instance.
	DeleteRemoved(instance string, ids []string) sqladapters.Query
	// ReleaseTenants clears the owner of those of the tenants ids that
	// instance owns.
	ReleaseTenants(instance string, ids []string) sqladapters.Query

	// Claim returns the statements of a claim of up to max tenants by
	// instance.
	Claim(instance string, max int) FleetClaim
}

// FleetClaim is one claim of tenants. The store runs its statements in
// one transaction of its own, in the order of the fields.
//
// A member row's expiry alone cannot hand a tenant over: a renewal that
// began before the row expired, and commits after, tells its instance
// that it still owns its tenants. So a claim first deletes the expired
// member rows, which waits for such a renewal and leaves the row it
// renewed; a renewal that comes after the delete finds no row and joins
// afresh, releasing what its instance owned (see
// sqladapters.FleetStore.Heartbeat). And a claimer's look at the members
// may predate a member that joined and claimed while the claim ran (on
// PostgreSQL a row locked after a concurrent update is checked against
// the statement's old view of the other tables): so Take checks the
// picked tenants again in a statement of its own, which sees every
// commit before the picked rows were locked.
type FleetClaim struct {
	// DeleteDead deletes the member rows that expired, waiting for the
	// transactions that hold them.
	DeleteDead sqladapters.Query
	// Member selects a row when instance is live, locking its member row
	// against deletion where the database has row locks.
	Member sqladapters.Query
	// DeleteOrphans deletes the removed tenants that no live instance
	// owns.
	DeleteOrphans sqladapters.Query
	// Pick selects the IDs (one column) of up to max tenants that are not
	// removed and have no live owner, in ID order, locking them, and
	// skipping those locked where the database can.
	Pick sqladapters.Query
	// Take gives instance those of the picked tenants ids that still are
	// not removed and have no live owner; where Read is nil it selects
	// their ID, server, database and schema.
	Take func(ids []string) sqladapters.Query
	// Read selects ID, server, database and schema of those of ids that
	// instance owns, where Take selects nothing; else nil.
	Read func(ids []string) sqladapters.Query
}

// FleetStore implements sqladapters.FleetStore on top of a FleetBuilder.
// Database packages embed it in their fleet type.
type FleetStore struct {
	b FleetBuilder
}

var _ sqladapters.FleetStore = (*FleetStore)(nil)

// NewFleet returns the FleetStore running b's SQL.
func NewFleet(b FleetBuilder) *FleetStore { return &FleetStore{b: b} }

// fleetAttempts bounds the runs of one transaction of the store's own
// that concurrent transactions roll back.
const fleetAttempts = 5

// minFleetTTL is the shortest membership: SQLite keeps milliseconds.
const minFleetTTL = time.Millisecond

// Name implements sqladapters.FleetStore.
func (s *FleetStore) Name() string { return s.b.Name() }

// Tables implements sqladapters.FleetStore.
func (s *FleetStore) Tables() []string { return s.b.Tables() }

// ClassifyError implements sqladapters.FleetStore. A missing table says
// how to create the fleet's tables, not an outbox's.
func (s *FleetStore) ClassifyError(err error) error {
	if err == nil || errors.Is(err, sqladapters.ErrMissingTable) || errors.Is(err, sqladapters.ErrDuplicate) {
		return err // classified already
	}
	err = s.b.ClassifyError(err)
	if mt, ok := err.(*sqladapters.MissingTableError); ok {
		mt.Fleet = true
	}
	return err
}

// Migrations implements sqladapters.FleetStore.
func (s *FleetStore) Migrations() []sqladapters.Migration { return s.b.Migrations() }

// AppliedMigrations implements sqladapters.FleetStore.
func (s *FleetStore) AppliedMigrations(ctx context.Context, e sqladapters.Executor) ([]int, error) {
	out, err := appliedMigrations(ctx, e, s.b)
	return out, s.ClassifyError(err)
}

// MigrationScript implements sqladapters.FleetStore.
func (s *FleetStore) MigrationScript() string {
	title := fmt.Sprintf("millbox fleet control tables for %s: %v", s.b.Name(), s.b.Tables())
	return migrationScript(title, s.b.ScriptNote(), s.b.CreateSchema(), s.b.Name()+" fleet", s.b.Migrations())
}

// Migrate implements sqladapters.FleetStore.
func (s *FleetStore) Migrate(ctx context.Context, tx sqladapters.Tx, migrations []sqladapters.Migration) error {
	return runMigrations(ctx, tx, s.b, migrations, nil)
}

// Heartbeat implements sqladapters.FleetStore.
func (s *FleetStore) Heartbeat(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration) (bool, error) {
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return false, err
	}
	if ttl < minFleetTTL {
		return false, fmt.Errorf("millbox: fleet: Heartbeat: ttl %v is shorter than %v", ttl, minFleetTTL)
	}
	n, err := s.execRetrying(ctx, e, s.b.RenewMember(instance, ttl))
	if err != nil || n > 0 {
		return n > 0, err
	}
	// The member row is missing or expired: whatever the instance owned
	// may be claimed already, so it starts with nothing.
	err = s.inTx(ctx, e, func(ex sqladapters.Executor) error {
		if _, err := s.exec(ctx, ex, s.b.JoinMember(instance, ttl)); err != nil {
			return err
		}
		_, err := s.exec(ctx, ex, s.b.ReleaseAll(instance))
		return err
	})
	return false, err
}

// LiveMembers implements sqladapters.FleetStore.
func (s *FleetStore) LiveMembers(ctx context.Context, e sqladapters.Executor) ([]string, error) {
	var out []string
	err := s.query(ctx, e, s.b.LiveMembers(), func(r sqladapters.Rows) error {
		var name string
		err := r.Scan(&name)
		out = append(out, name)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(out)
	return out, nil
}

// Leave implements sqladapters.FleetStore.
func (s *FleetStore) Leave(ctx context.Context, e sqladapters.Executor, instance string) error {
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return err
	}
	return s.inTx(ctx, e, func(ex sqladapters.Executor) error {
		if _, err := s.exec(ctx, ex, s.b.RemoveMember(instance)); err != nil {
			return err
		}
		deleted, err := s.exec(ctx, ex, s.b.DeleteOwnedRemoved(instance))
		if err != nil {
			return err
		}
		if _, err := s.exec(ctx, ex, s.b.ReleaseAll(instance)); err != nil {
			return err
		}
		return s.bumpIf(ctx, ex, deleted > 0)
	})
}

// PutTenants implements sqladapters.FleetStore. It reads the tenants
// first and writes only those that changed, so that it knows whether the
// catalog did, on every database (MySQL counts unchanged rows as changed
// or not depending on the client's flags).
func (s *FleetStore) PutTenants(ctx context.Context, e sqladapters.Executor, tenants []sqladapters.FleetTenant) error {
	seen := make(map[string]bool, len(tenants))
	for _, t := range tenants {
		if err := t.Validate(); err != nil {
			return err
		}
		if seen[t.ID] {
			return fmt.Errorf("%w %q: given twice in one PutTenants", sqladapters.ErrInvalidTenant, t.ID)
		}
		seen[t.ID] = true
	}
	if len(tenants) == 0 {
		return nil
	}
	ts := slices.SortedFunc(slices.Values(tenants), func(a, b sqladapters.FleetTenant) int { return cmp.Compare(a.ID, b.ID) })
	return s.inTx(ctx, e, func(ex sqladapters.Executor) error {
		if q, ok := s.b.BeginWrite(); ok {
			if _, err := s.exec(ctx, ex, q); err != nil {
				return err
			}
		}
		old := make(map[string]sqladapters.FleetTenant, len(ts))
		for _, ids := range s.chunks(tenantIDs(ts)) {
			got, err := s.tenants(ctx, ex, s.b.LockTenants(ids), false)
			if err != nil {
				return err
			}
			for _, t := range got {
				old[t.ID] = t
			}
		}
		var added, changed []sqladapters.FleetTenant
		for _, t := range ts {
			o, ok := old[t.ID]
			switch {
			case !ok:
				added = append(added, t)
			case o.Server != t.Server || o.Database != t.Database || o.Schema != t.Schema || o.Removed:
				changed = append(changed, t)
			}
		}
		if len(added) > 0 {
			for _, q := range s.b.InsertTenants(added) {
				if _, err := s.exec(ctx, ex, q); err != nil {
					return err
				}
			}
		}
		for _, t := range changed {
			if _, err := s.exec(ctx, ex, s.b.UpdateTenant(t)); err != nil {
				return err
			}
		}
		return s.bumpIf(ctx, ex, len(added)+len(changed) > 0)
	})
}

// RemoveTenants implements sqladapters.FleetStore.
func (s *FleetStore) RemoveTenants(ctx context.Context, e sqladapters.Executor, ids []string) error {
	ids, err := checkIDs(ids)
	if err != nil || len(ids) == 0 {
		return err
	}
	return s.inTx(ctx, e, func(ex sqladapters.Executor) error {
		var changed int64
		// Marking locks the tenants first, so that none is claimed while
		// the unowned ones are deleted.
		for _, q := range [](func([]string) sqladapters.Query){s.b.MarkRemoved, s.b.DeleteUnowned} {
			for _, c := range s.chunks(ids) {
				n, err := s.exec(ctx, ex, q(c))
				if err != nil {
					return err
				}
				changed += n
			}
		}
		return s.bumpIf(ctx, ex, changed > 0)
	})
}

// CatalogVersion implements sqladapters.FleetStore.
func (s *FleetStore) CatalogVersion(ctx context.Context, e sqladapters.Executor) (int64, error) {
	var (
		v     int64
		found bool
	)
	err := s.query(ctx, e, s.b.CatalogVersion(), func(r sqladapters.Rows) error {
		found = true
		return r.Scan(&v)
	})
	if err == nil && !found {
		err = fmt.Errorf("millbox: fleet: the catalog version's row in %s is missing; run sqladapters.MigrateFleet again", s.b.Tables())
	}
	return v, err
}

// Tenants implements sqladapters.FleetStore.
func (s *FleetStore) Tenants(ctx context.Context, e sqladapters.Executor) ([]sqladapters.FleetTenant, error) {
	return s.tenants(ctx, e, s.b.SelectTenants(), true)
}

// OwnedTenants implements sqladapters.FleetStore.
func (s *FleetStore) OwnedTenants(ctx context.Context, e sqladapters.Executor, instance string) ([]sqladapters.FleetTenant, error) {
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return nil, err
	}
	ts, err := s.tenants(ctx, e, s.b.OwnedTenants(instance), false)
	for i := range ts {
		ts[i].Owner = instance
	}
	return ts, err
}

// ClaimTenants implements sqladapters.FleetStore.
func (s *FleetStore) ClaimTenants(ctx context.Context, db sqladapters.DB, instance string, max int) ([]sqladapters.FleetTenant, error) {
	if db == nil {
		return nil, errors.New("millbox: fleet: ClaimTenants: nil DB")
	}
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return nil, err
	}
	if max < 1 {
		return nil, fmt.Errorf("millbox: fleet: ClaimTenants: max %d must be positive", max)
	}
	c := s.b.Claim(instance, max)
	var got []sqladapters.FleetTenant
	err := s.ownTx(ctx, db, func(tx sqladapters.Executor) (err error) {
		got, err = s.claim(ctx, tx, instance, c)
		return err
	})
	if err != nil {
		return nil, err
	}
	for i := range got {
		got[i].Owner = instance
	}
	slices.SortFunc(got, func(a, b sqladapters.FleetTenant) int { return cmp.Compare(a.ID, b.ID) })
	return got, nil
}

// claim runs c in tx (see FleetClaim).
func (s *FleetStore) claim(ctx context.Context, tx sqladapters.Executor, instance string, c FleetClaim) ([]sqladapters.FleetTenant, error) {
	if _, err := s.exec(ctx, tx, c.DeleteDead); err != nil {
		return nil, err
	}
	live := false
	if err := s.query(ctx, tx, c.Member, func(sqladapters.Rows) error { live = true; return nil }); err != nil {
		return nil, err
	}
	if !live {
		return nil, fmt.Errorf("%w: instance %q has no live member row (Heartbeat first)", sqladapters.ErrNotFleetMember, instance)
	}
	orphans, err := s.exec(ctx, tx, c.DeleteOrphans)
	if err != nil {
		return nil, err
	}
	if err := s.bumpIf(ctx, tx, orphans > 0); err != nil {
		return nil, err
	}
	var picked []string
	err = s.query(ctx, tx, c.Pick, func(r sqladapters.Rows) error {
		var id string
		err := r.Scan(&id)
		picked = append(picked, id)
		return err
	})
	if err != nil || len(picked) == 0 {
		return nil, err
	}
	var got []sqladapters.FleetTenant
	for _, ids := range s.chunks(picked) {
		take := c.Take(ids)
		if c.Read != nil {
			if _, err := s.exec(ctx, tx, take); err != nil {
				return nil, err
			}
			take = c.Read(ids)
		}
		err := s.query(ctx, tx, take, func(r sqladapters.Rows) error {
			var t sqladapters.FleetTenant
			err := r.Scan(&t.ID, &t.Server, &t.Database, &t.Schema)
			got = append(got, t)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return got, nil
}

// ReleaseTenants implements sqladapters.FleetStore.
func (s *FleetStore) ReleaseTenants(ctx context.Context, e sqladapters.Executor, instance string, ids []string) error {
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return err
	}
	ids, err := checkIDs(ids)
	if err != nil || len(ids) == 0 {
		return err
	}
	for _, c := range s.chunks(ids) {
		if _, err := s.execRetrying(ctx, e, s.b.ReleaseTenants(instance, c)); err != nil {
			return err
		}
	}
	return nil
}

// DeleteRemoved implements sqladapters.FleetStore.
func (s *FleetStore) DeleteRemoved(ctx context.Context, e sqladapters.Executor, instance string, ids []string) (int64, error) {
	if err := sqladapters.ValidateFleetInstance(instance); err != nil {
		return 0, err
	}
	ids, err := checkIDs(ids)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	var deleted int64
	err = s.inTx(ctx, e, func(ex sqladapters.Executor) error {
		deleted = 0
		for _, c := range s.chunks(ids) {
			n, err := s.exec(ctx, ex, s.b.DeleteRemoved(instance, c))
			if err != nil {
				return err
			}
			deleted += n
		}
		return s.bumpIf(ctx, ex, deleted > 0)
	})
	if err != nil {
		return 0, err
	}
	return deleted, nil
}

// bumpIf moves the catalog version when changed.
func (s *FleetStore) bumpIf(ctx context.Context, e sqladapters.Executor, changed bool) error {
	if !changed {
		return nil
	}
	_, err := s.exec(ctx, e, s.b.BumpVersion())
	return err
}

// tenants runs q, which selects ID, server, database, schema, removed and,
// withOwner, the live owner, and returns the tenants in ID order.
func (s *FleetStore) tenants(ctx context.Context, e sqladapters.Executor, q sqladapters.Query, withOwner bool) ([]sqladapters.FleetTenant, error) {
	var out []sqladapters.FleetTenant
	err := s.query(ctx, e, q, func(r sqladapters.Rows) error {
		var (
			t     sqladapters.FleetTenant
			owner sql.NullString
		)
		dest := []any{&t.ID, &t.Server, &t.Database, &t.Schema, &t.Removed, &owner}
		if !withOwner {
			dest = dest[:5]
		}
		err := r.Scan(dest...)
		t.Owner = owner.String
		out = append(out, t)
		return err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b sqladapters.FleetTenant) int { return cmp.Compare(a.ID, b.ID) })
	return out, nil
}

// inTx runs fn in one transaction: its own when e is a DB (see ownTx),
// else a savepoint of the caller's, so that a failure leaves nothing of
// fn in it.
func (s *FleetStore) inTx(ctx context.Context, e sqladapters.Executor, fn func(sqladapters.Executor) error) error {
	if db, ok := e.(sqladapters.DB); ok {
		return s.ownTx(ctx, db, fn)
	}
	set, rollback, release, ok := s.b.Savepoint()
	if !ok {
		return fn(e)
	}
	if _, err := s.exec(ctx, e, set); err != nil {
		return err
	}
	if err := fn(e); err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, rerr := rollback.Exec(uctx, e); rerr != nil {
			return fmt.Errorf("%w (rolling back to the savepoint failed too: %v)", err, rerr)
		}
		_, _ = release.Exec(uctx, e)
		return err
	}
	_, err := s.exec(ctx, e, release)
	return err
}

// ownTx runs fn in a transaction of its own on db, and runs it again when
// a concurrent transaction made the database roll it back (a deadlock), or
// a concurrent insert of the same key failed it.
func (s *FleetStore) ownTx(ctx context.Context, db sqladapters.DB, fn func(sqladapters.Executor) error) error {
	for attempt := 1; ; attempt++ {
		err := s.txOnce(ctx, db, fn)
		if err == nil || attempt == fleetAttempts ||
			!(s.b.RetryConflict(err) || errors.Is(err, sqladapters.ErrDuplicate)) || !pause(ctx, attempt) {
			return err
		}
	}
}

// pause waits a little before the next attempt of a transaction a
// concurrent one rolled back, longer and at random after each, so that
// the two do not collide again; false when ctx ended.
func pause(ctx context.Context, attempt int) bool {
	t := time.NewTimer(time.Duration(1+rand.IntN(10*attempt)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (s *FleetStore) txOnce(ctx context.Context, db sqladapters.DB, fn func(sqladapters.Executor) error) error {
	tx, err := db.Begin(ctx, sql.TxOptions{})
	if err != nil {
		return s.ClassifyError(err)
	}
	if err := fn(tx); err != nil {
		sqladapters.Rollback(tx)
		return err
	}
	return s.ClassifyError(tx.Commit(ctx))
}

// execRetrying runs q, a statement of its own when e is a DB, and runs it
// again when the database rolled it back for a concurrent transaction.
func (s *FleetStore) execRetrying(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (int64, error) {
	_, own := e.(sqladapters.DB)
	for attempt := 1; ; attempt++ {
		n, err := s.exec(ctx, e, q)
		if err == nil || !own || attempt == fleetAttempts || !s.b.RetryConflict(err) || !pause(ctx, attempt) {
			return n, err
		}
	}
}

// chunks splits ids into lists of at most IDsPerStatement, none when ids
// is empty.
func (s *FleetStore) chunks(ids []string) [][]string {
	n := s.b.IDsPerStatement()
	if len(ids) == 0 {
		return nil
	}
	if n <= 0 || len(ids) <= n {
		return [][]string{ids}
	}
	return slices.Collect(slices.Chunk(ids, n))
}

// exec runs q and classifies its error.
func (s *FleetStore) exec(ctx context.Context, e sqladapters.Executor, q sqladapters.Query) (int64, error) {
	n, err := q.Exec(ctx, e)
	return n, s.ClassifyError(err)
}

// query runs q, calls scan for each row, and classifies the errors of the
// query and of the result set.
func (s *FleetStore) query(ctx context.Context, e sqladapters.Executor, q sqladapters.Query, scan func(sqladapters.Rows) error) error {
	rows, err := q.Query(ctx, e)
	if err != nil {
		return s.ClassifyError(err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return s.ClassifyError(rows.Err())
}

// checkIDs validates ids and returns them sorted without repeats, so that
// statements lock the tenants in one order.
func checkIDs(ids []string) ([]string, error) {
	for _, id := range ids {
		if err := sqladapters.ValidateTenantID(id); err != nil {
			return nil, err
		}
	}
	return slices.Compact(slices.Sorted(slices.Values(ids))), nil
}

// tenantIDs returns the IDs of ts, in their order.
func tenantIDs(ts []sqladapters.FleetTenant) []string {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.ID
	}
	return ids
}
