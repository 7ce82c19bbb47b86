package integration_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func newInbox(t *testing.T, d sqladapters.Dialect) *inbox.Inbox {
	t.Helper()
	ib, err := inbox.New(inbox.Config{Dialect: d})
	if err != nil {
		t.Fatal(err)
	}
	return ib
}

func (f *inboxFixture) begin() sqladapters.Tx {
	f.t.Helper()
	tx, err := f.db.Begin(f.ctx, sql.TxOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { sqladapters.Rollback(tx) })
	return tx
}

func (f *inboxFixture) record(ib *inbox.Inbox, tx sqladapters.Tx, consumer, id string) bool {
	f.t.Helper()
	first, err := ib.Record(f.ctx, tx, consumer, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return first
}

func TestInboxRecord(t *testing.T) {
	t.Parallel()

	t.Run("FirstThenDuplicate", func(t *testing.T) {
		f := newInboxFixture(t)
		ib := newInbox(t, f.d)
		tx := f.begin()
		if !f.record(ib, tx, "billing", "m1") {
			t.Fatal("first record reported a duplicate")
		}
		if err := tx.Commit(f.ctx); err != nil {
			t.Fatal(err)
		}
		tx = f.begin()
		if f.record(ib, tx, "billing", "m1") {
			t.Fatal("second record of a committed key reported first")
		}
		if !f.record(ib, tx, "shipping", "m1") {
			t.Fatal("another consumer's record of the same id reported a duplicate")
		}
	})

	t.Run("RollbackForgets", func(t *testing.T) {
		f := newInboxFixture(t)
		ib := newInbox(t, f.d)
		tx := f.begin()
		f.record(ib, tx, "billing", "m1")
		if err := tx.Rollback(f.ctx); err != nil {
			t.Fatal(err)
		}
		if !f.record(ib, f.begin(), "billing", "m1") {
			t.Fatal("a rolled-back record still counts")
		}
	})

	// A second transaction recording the same key waits for the first and
	// then follows its outcome.
	for _, outcome := range []string{"Commit", "Rollback"} {
		t.Run("ConcurrentThen"+outcome, func(t *testing.T) {
			f := newInboxFixture(t)
			ib := newInbox(t, f.d)
			a := f.begin()
			f.record(ib, a, "billing", "m1")
			type result struct {
				first bool
				err   error
			}
			done := make(chan result, 1)
			go func() {
				tx, err := f.db.Begin(f.ctx, sql.TxOptions{})
				if err != nil {
					done <- result{err: err}
					return
				}
				defer sqladapters.Rollback(tx)
				first, err := ib.Record(f.ctx, tx, "billing", "m1")
				done <- result{first, err}
			}()
			f.waitInboxLockWaiters(1)
			var err error
			if outcome == "Commit" {
				err = a.Commit(f.ctx)
			} else {
				err = a.Rollback(f.ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			r := <-done
			if r.err != nil {
				t.Fatal(r.err)
			}
			if want := outcome == "Rollback"; r.first != want {
				t.Fatalf("after the other transaction's %s, first = %v, want %v", outcome, r.first, want)
			}
		})
	}

	t.Run("BadInput", func(t *testing.T) {
		f := newInboxFixture(t)
		ib := newInbox(t, f.d)
		if _, err := ib.Record(f.ctx, nil, "billing", "m1"); !errors.Is(err, sqladapters.ErrNoTx) {
			t.Fatalf("nil tx: want ErrNoTx, got %v", err)
		}
		tx := f.begin()
		for _, c := range []struct{ name, consumer, id, want string }{
			{"EmptyConsumer", "", "m1", "consumer is empty"},
			{"EmptyID", "billing", "", "message id is empty"},
			{"InvalidUTF8Consumer", "bill\xffing", "m1", "not valid UTF-8"},
			{"InvalidUTF8ID", "billing", "m\xc3", "not valid UTF-8"},
			{"NUL", "billing", "m\x001", "NUL"},
			{"TooLong", "billing", strings.Repeat("x", inbox.MaxKeyBytes+1), "longer than"},
		} {
			_, err := ib.Record(f.ctx, tx, c.consumer, c.id)
			if !errors.Is(err, inbox.ErrInvalidKey) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: want ErrInvalidKey saying %q, got %v", c.name, c.want, err)
			}
		}
		// The rejected keys never reached the database: tx is still usable.
		if !f.record(ib, tx, "billing", strings.Repeat("x", inbox.MaxKeyBytes)) {
			t.Fatal("a key of MaxKeyBytes was not recorded")
		}
	})

	t.Run("MissingTable", func(t *testing.T) {
		f := newInboxFixture(t)
		d := postgres.MustNew(postgres.Options{Schema: f.d.Schema(), InboxTable: "no_such_inbox"})
		_, err := newInbox(t, d).Record(f.ctx, f.begin(), "billing", "m1")
		var mt *sqladapters.MissingTableError
		if !errors.As(err, &mt) || !errors.Is(err, sqladapters.ErrMissingTable) {
			t.Fatalf("want *MissingTableError, got %v", err)
		}
		if !strings.Contains(err.Error(), "sqladapters.Migrate") || !strings.Contains(err.Error(), "no_such_inbox") {
			t.Fatalf("error does not name the table and say how to migrate: %v", err)
		}
	})

	t.Run("Config", func(t *testing.T) {
		_, err := inbox.New(inbox.Config{})
		if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "Dialect") {
			t.Fatalf("nil dialect: want ErrInvalidConfig naming Dialect, got %v", err)
		}
	})
}

// waitInboxLockWaiters waits until n sessions are blocked inserting into
// this fixture's inbox table.
func (f *inboxFixture) waitInboxLockWaiters(n int) {
	f.t.Helper()
	inboxWait(f.t, "a transaction waiting on the inbox key", func() bool {
		return f.inboxLockWaiters() >= n
	})
}

func (f *inboxFixture) inboxLockWaiters() int {
	return f.queryInt(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`,
		"INSERT INTO "+f.d.InboxTable()+"%")
}

func TestInboxCleaner(t *testing.T) {
	t.Parallel()

	seed := func(f *inboxFixture, prefix string, n int, age string) {
		f.exec(`INSERT INTO `+f.d.InboxTable()+` (consumer, message_id, received_at)
SELECT 'billing', $1 || g, now() - $2::interval FROM generate_series(1, $3::int) g`, prefix, age, n)
	}
	count := func(f *inboxFixture, prefix string) int {
		return f.queryInt(`SELECT count(*) FROM `+f.d.InboxTable()+` WHERE message_id LIKE $1`, prefix+"%")
	}

	t.Run("CleanOnceInBatches", func(t *testing.T) {
		f := newInboxFixture(t)
		seed(f, "old-", 25, "30 days")
		seed(f, "recent-", 5, "1 hour")
		seed(f, "fresh-", 5, "0")
		rec := &recordingDB{DB: f.db}
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: rec, Dialect: f.d, Retention: 24 * time.Hour, BatchSize: 10})
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.CleanOnce(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != 25 {
			t.Fatalf("deleted %d, want 25", n)
		}
		if len(rec.stmts) != 3 {
			t.Fatalf("ran %d delete statements, want 3 batches of at most 10", len(rec.stmts))
		}
		if got := count(f, "old-"); got != 0 {
			t.Fatalf("%d old rows left", got)
		}
		if got := count(f, "recent-") + count(f, "fresh-"); got != 10 {
			t.Fatalf("%d rows within the retention window left, want 10", got)
		}
		if n, err := c.CleanOnce(f.ctx); err != nil || n != 0 {
			t.Fatalf("second CleanOnce deleted %d, %v", n, err)
		}
	})

	t.Run("RunAndClose", func(t *testing.T) {
		f := newInboxFixture(t)
		seed(f, "old-", 30, "15 days")
		seed(f, "recent-", 3, "1 day")
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: f.db, Dialect: f.d, BatchSize: 7, Interval: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case <-c.Running():
			t.Fatal("Running before Run")
		default:
		}
		errc := make(chan error, 1)
		go func() { errc <- c.Run(context.Background()) }()
		<-c.Running()
		if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrRunning) {
			t.Fatalf("second Run: want ErrRunning, got %v", err)
		}
		// Run cleans at start; DefaultRetention (14 days) keeps the 1-day rows.
		inboxWait(t, "the first cleaning round", func() bool { return count(f, "old-") == 0 })
		if got := count(f, "recent-"); got != 3 {
			t.Fatalf("%d recent rows left, want 3", got)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("Run returned %v after Close", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrClosed) {
			t.Fatalf("Run after Close: want ErrClosed, got %v", err)
		}
	})

	t.Run("RunEndsWithContext", func(t *testing.T) {
		f := newInboxFixture(t)
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: f.db, Dialect: f.d})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		<-c.Running()
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("CloseWithoutRun", func(t *testing.T) {
		f := newInboxFixture(t)
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: f.db, Dialect: f.d})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("MissingTable", func(t *testing.T) {
		f := newInboxFixture(t)
		d := postgres.MustNew(postgres.Options{Schema: f.d.Schema(), InboxTable: "no_such_inbox"})
		c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: f.db, Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CleanOnce(f.ctx)
		if !errors.Is(err, sqladapters.ErrMissingTable) || !strings.Contains(err.Error(), "sqladapters.Migrate") {
			t.Fatalf("want ErrMissingTable saying how to migrate, got %v", err)
		}
	})

	t.Run("Config", func(t *testing.T) {
		pool := testenv.Postgres(t)
		db := pgxv5.WrapPool(pool)
		d := postgres.MustNew(postgres.Options{})
		for _, c := range []struct {
			name  string
			cfg   inbox.CleanerConfig
			field string
		}{
			{"NilDB", inbox.CleanerConfig{Dialect: d}, "DB"},
			{"NilDialect", inbox.CleanerConfig{DB: db}, "Dialect"},
			{"ShortRetention", inbox.CleanerConfig{DB: db, Dialect: d, Retention: time.Second}, "Retention"},
			{"NegativeBatch", inbox.CleanerConfig{DB: db, Dialect: d, BatchSize: -1}, "BatchSize"},
			{"NegativeInterval", inbox.CleanerConfig{DB: db, Dialect: d, Interval: -time.Second}, "Interval"},
			{"NegativeCloseTimeout", inbox.CleanerConfig{DB: db, Dialect: d, CloseTimeout: -time.Second}, "CloseTimeout"},
		} {
			_, err := inbox.NewCleaner(c.cfg)
			if !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "CleanerConfig."+c.field) {
				t.Errorf("%s: want ErrInvalidConfig naming %s, got %v", c.name, c.field, err)
			}
		}
	})
}
