package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest"
	"github.com/millbox/millbox/sqladapters/internal/dialecttest/mysqltest"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

// TestMigrateConcurrentFreshDatabase starts a fleet for the first time:
// ten instances migrate at once into a database (Options.Database) that
// does not exist yet, through a pool whose every connection has dropped
// it if it existed. Every one of them must succeed, in every round.
func TestMigrateConcurrentFreshDatabase(t *testing.T) {
	const rounds, migrators = 20, 10
	raw := mysqltest.DB(t)
	db := stdsql.WrapDB(raw)
	ctx := dialecttest.Ctx(t, 4*time.Minute)
	for round := range rounds {
		name := dialecttest.UniqueName("fleet_")
		t.Cleanup(func() {
			if _, err := raw.ExecContext(context.Background(), "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
				t.Logf("drop database %s: %v", name, err)
			}
		})
		dropOnEveryConnection(t, ctx, raw, name, migrators)
		d := mysql.MustNew(mysql.Options{Database: name})
		errs := make([]error, migrators)
		var wg sync.WaitGroup
		for i := range migrators {
			wg.Go(func() { errs[i] = sqladapters.Migrate(ctx, db, d) })
		}
		wg.Wait()
		var failed []error
		for i, err := range errs {
			if err != nil {
				failed = append(failed, fmt.Errorf("migrator %d: %w", i, err))
			}
		}
		if len(failed) > 0 {
			t.Errorf("round %d: %d of %d concurrent migrations failed: %v", round+1, len(failed), migrators, errors.Join(failed...))
		}
	}
}

// dropOnEveryConnection holds n connections of db at once and drops the
// database name on each, so that every pooled connection looked it up.
func dropOnEveryConnection(t *testing.T, ctx context.Context, db *sql.DB, name string, n int) {
	t.Helper()
	var conns []*sql.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			t.Fatal(err)
		}
	}
}
