package dialecttest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
)

// FleetStatements returns one of every statement b builds, by name: the
// migrations' statements, the bookkeeping, and every method's, with
// arguments of each kind.
func FleetStatements(b sqlstore.FleetBuilder) map[string]sqladapters.Query {
	t := sqladapters.FleetTenant{ID: "t", Server: "s", Database: "d", Schema: "x"}
	ids := []string{"a", "b"}
	lock, unlock := b.LockMigrations()
	qs := map[string]sqladapters.Query{
		"Lock":               lock,
		"Unlock":             unlock,
		"AppliedMigrations":  b.AppliedMigrations(),
		"RecordMigration":    b.RecordMigration(1, "x"),
		"RenewMember":        b.RenewMember("i", time.Second),
		"JoinMember":         b.JoinMember("i", time.Second),
		"LiveMembers":        b.LiveMembers(),
		"RemoveMember":       b.RemoveMember("i"),
		"ReleaseAll":         b.ReleaseAll("i"),
		"DeleteOwnedRemoved": b.DeleteOwnedRemoved("i"),
		"CatalogVersion":     b.CatalogVersion(),
		"BumpVersion":        b.BumpVersion(),
		"SelectTenants":      b.SelectTenants(),
		"OwnedTenants":       b.OwnedTenants("i"),
		"LockTenants":        b.LockTenants(ids),
		"UpdateTenant":       b.UpdateTenant(t),
		"MarkRemoved":        b.MarkRemoved(ids),
		"DeleteUnowned":      b.DeleteUnowned(ids),
		"DeleteRemoved":      b.DeleteRemoved("i", ids),
		"ReleaseTenants":     b.ReleaseTenants("i", ids),
	}
	for i, q := range b.InsertTenants([]sqladapters.FleetTenant{t, t}) {
		qs[fmt.Sprint("InsertTenants", i)] = q
	}
	if q, ok := b.BeginWrite(); ok {
		qs["BeginWrite"] = q
	}
	c := b.Claim("i", 5)
	qs["Claim.DeleteDead"], qs["Claim.Member"], qs["Claim.DeleteOrphans"], qs["Claim.Pick"] = c.DeleteDead, c.Member, c.DeleteOrphans, c.Pick
	qs["Claim.Take"] = c.Take(ids)
	if c.Read != nil {
		qs["Claim.Read"] = c.Read(ids)
	}
	for i, q := range append(b.CreateSchema(), b.CreateMigrationsTable()...) {
		qs[fmt.Sprint("Create", i)] = q
	}
	for _, m := range b.Migrations() {
		for i, s := range m.Statements {
			qs[fmt.Sprintf("Migration%d.%d", m.Version, i)] = sqladapters.Query{SQL: s}
		}
	}
	return qs
}

// CheckFleetQuoting checks that every statement of b that names ident
// (the schema, database or prefix b was built with) quotes it: quote
// comes before it.
func CheckFleetQuoting(t *testing.T, b sqlstore.FleetBuilder, ident string, quote byte) {
	t.Helper()
	for name, q := range FleetStatements(b) {
		if q.SQL == "" {
			continue
		}
		for i := strings.Index(q.SQL, ident); i >= 0; {
			if i == 0 || q.SQL[i-1] != quote {
				t.Errorf("%s: %s not quoted at %d:\n%s", name, ident, i, q.SQL)
				break
			}
			j := strings.Index(q.SQL[i+1:], ident)
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
}

// CheckFleetOptions checks that build refuses every one of bad, with an
// error that wraps ErrInvalidName or ErrInvalidConfig and names the
// options, field (such as "postgres.FleetOptions.").
func CheckFleetOptions[O any](t *testing.T, build func(O) error, field string, bad map[string]O) {
	t.Helper()
	for name, o := range bad {
		err := build(o)
		if !errors.Is(err, sqladapters.ErrInvalidName) && !errors.Is(err, sqladapters.ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidName or ErrInvalidConfig", name, err)
			continue
		}
		if !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v does not name %s", name, err, field)
		}
	}
}
