package integration_test

import (
	"context"
	"database/sql"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	mysqldrv "github.com/go-sql-driver/mysql"

	"github.com/millbox/millbox/integration/conformance"
	"github.com/millbox/millbox/integration/testenv"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/mysql"
	"github.com/millbox/millbox/sqladapters/stdsql"
	"github.com/millbox/millbox/sqladapters/wmsql"
)

// myEnv builds the MariaDB/MySQL conformance environment. db runs the
// forwarder and the assertions; the sources cover both protocols of
// go-sql-driver/mysql and watermill-sql's wrappers.
func myEnv(t *testing.T, db *sql.DB, opts mysql.Options) conformance.Env {
	prepared := testenv.MySQL(t)
	interpolated := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.InterpolateParams = true }))
	return conformance.Env{
		DB: stdsql.WrapDB(db),
		NewDialect: func(t *testing.T) sqladapters.Dialect {
			return testenv.MySQLDialect(t, db, opts)
		},
		NewUnmigratedDialect: func(t *testing.T) sqladapters.Dialect {
			return mysql.MustNew(mysql.Options{OutboxTable: testenv.UniqueName("missing_"), InboxTable: testenv.UniqueName("missing_inbox_")})
		},
		// Times go as UTC text, so the DSN's loc cannot shift them.
		TimeArg: func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") },
		InboxDBs: []conformance.DBSource{
			{Name: "database-sql", DB: stdsql.WrapDB(prepared)},
			{Name: "database-sql-interpolateParams", DB: stdsql.WrapDB(interpolated)},
		},
		IsolationLevels: []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelReadCommitted},
		// innodb_trx would tell lock waits apart, but InnoDB refreshes it
		// only once nobody has read it for 0.1s, so polling it sees
		// nothing new. The process list is live; the session holding the
		// key has finished its insert, so any session still running the
		// inbox insert waits on it.
		InboxLockWaiters: func(ctx context.Context, d sqladapters.Dialect) (int, error) {
			var n int
			err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist WHERE command IN ('Query', 'Execute') AND info LIKE ?`,
				"INSERT IGNORE INTO "+d.InboxTable()+"%").Scan(&n)
			return n, err
		},
		Sources: []conformance.TxSource{
			{Name: "database-sql", Begin: stdBegin(prepared)},
			{Name: "database-sql-interpolateParams", Begin: stdBegin(interpolated)},
			{Name: "watermill-sql-TxFromStdSQL", Begin: wmStdBegin(prepared)},
			{Name: "watermill-sql-BeginnerFromStdSQL", Begin: beginOn(wmsql.WrapBeginner(wsql.BeginnerFromStdSQL(interpolated)))},
		},
	}
}

func TestMySQLOutboxConformance(t *testing.T) {
	conformance.Outbox(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
}

func TestMySQLInboxConformance(t *testing.T) {
	conformance.Inbox(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
}

// TestMySQLForwarderConformance runs the forwarder suite twice: with the
// default protocol and plain claims, and with interpolateParams (the
// recommended DSN) and SKIP LOCKED claims when the server has them.
func TestMySQLForwarderConformance(t *testing.T) {
	t.Run("prepared", func(t *testing.T) {
		conformance.Forwarder(t, myEnv(t, testenv.MySQL(t), mysql.Options{}))
	})
	t.Run("interpolateParams", func(t *testing.T) {
		db := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.InterpolateParams = true }))
		skip, err := mysql.DetectSkipLocked(context.Background(), stdsql.WrapDB(db))
		if err != nil {
			t.Fatal(err)
		}
		conformance.Forwarder(t, myEnv(t, db, mysql.Options{SkipLocked: skip}))
	})
}

// TestMySQLDetectMaxAllowedPacket reads the server's max_allowed_packet
// into a dialect whose message limit then fits it.
func TestMySQLDetectMaxAllowedPacket(t *testing.T) {
	raw := testenv.MySQL(t)
	ctx := testenv.Ctx(t, time.Minute)
	n, err := mysql.DetectMaxAllowedPacket(ctx, stdsql.WrapDB(raw))
	if err != nil {
		t.Fatal(err)
	}
	var want int
	if err := raw.QueryRowContext(ctx, `SELECT @@global.max_allowed_packet`).Scan(&want); err != nil || n != want {
		t.Fatalf("detected %d, server has %d (%v)", n, want, err)
	}
	d, err := mysql.New(mysql.Options{MaxAllowedPacket: n})
	if err != nil {
		t.Fatal(err)
	}
	if m := d.MaxMessageBytes(); m <= 0 || 2*m >= n {
		t.Fatalf("MaxMessageBytes %d for max_allowed_packet %d", m, n)
	}
}

func TestMySQLMigrations(t *testing.T) {
	raw := testenv.MySQL(t)
	db := stdsql.WrapDB(raw)
	ctx := testenv.Ctx(t, 2*time.Minute)

	t.Run("FreshRerunAndPrintedSQL", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		migrateTwice(t, ctx, db, d)
		// The printed script, run by another tool (here one multi-statement
		// call), creates the same columns and indexes.
		d2 := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		multi := testenv.OpenMySQL(t, testenv.MySQLDSNWith(t, func(c *mysqldrv.Config) { c.MultiStatements = true }))
		if _, err := multi.ExecContext(ctx, sqladapters.MigrationSQL(d2)); err != nil {
			t.Fatalf("printed SQL does not apply: %v", err)
		}
		a, b := myShape(t, ctx, raw, d), myShape(t, ctx, raw, d2)
		if a != b {
			t.Fatalf("printed SQL made another schema:\n%s\nvs Migrate:\n%s", b, a)
		}
		for _, want := range []string{"payload:longblob", "metadata:longtext", "created_at:datetime(6)", "index received_idx", "index PRIMARY:consumer,message_id",
			"_dead index fp_idx:error_fp,id", "_kept index PRIMARY:id"} {
			if !strings.Contains(a, want) {
				t.Fatalf("schema lacks %q:\n%s", want, a)
			}
		}
		// The outbox keeps one index, its primary key: dead letters and
		// kept rows live in tables of their own.
		for _, gone := range []string{"index state_idx", "index retry_idx"} {
			if strings.Contains(a, gone) {
				t.Fatalf("schema still has %q:\n%s", gone, a)
			}
		}
	})

	t.Run("ConcurrentMigrators", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = sqladapters.Migrate(ctx, db, d)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		var n int
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+d.Tables()[4]).Scan(&n); err != nil || n != len(d.Migrations()) {
			t.Fatalf("versions recorded: %d, %v", n, err)
		}
	})

	t.Run("MigrateTxRefused", func(t *testing.T) {
		d := mysql.MustNew(testenv.MySQLNames(t, raw, mysql.Options{}))
		own := testenv.UniqueName("app_")
		if _, err := raw.ExecContext(ctx, "CREATE TABLE `"+own+"` (id INT PRIMARY KEY) ENGINE=InnoDB"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Exec("DROP TABLE IF EXISTS `" + own + "`") })
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO `"+own+"` (id) VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		err = sqladapters.MigrateTx(ctx, tx, d)
		if err == nil || !strings.Contains(err.Error(), "commits DDL implicitly") {
			t.Fatalf("want MigrateTx refused, got %v", err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		// Nothing ran: the caller's row rolled back with its transaction,
		// and no millbox table appeared.
		var n int
		if err := raw.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+own+"`").Scan(&n); err != nil || n != 0 {
			t.Fatalf("caller's transaction committed: %d rows, %v", n, err)
		}
		if err := raw.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE ?`,
			strings.Trim(d.OutboxTable(), "`")+"%").Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d millbox tables after a refused MigrateTx (%v)", n, err)
		}
	})

	t.Run("OwnDatabase", func(t *testing.T) {
		name := testenv.UniqueName("db_")
		t.Cleanup(func() { raw.Exec("DROP DATABASE IF EXISTS `" + name + "`") })
		d := mysql.MustNew(mysql.Options{Database: name})
		if err := sqladapters.Migrate(ctx, db, d); err != nil {
			t.Fatal(err)
		}
		tx, err := db.Begin(ctx, sql.TxOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.InsertOutbox(ctx, tx, []sqladapters.OutboxMessage{{Topic: "t", UUID: "u", Payload: []byte{}, Metadata: []byte("{}")}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if rows := conformance.ReadPending(t, ctx, db, d); len(rows) != 1 {
			t.Fatalf("%d rows in %s", len(rows), d.OutboxTable())
		}
	})
}

// myShape describes the columns and indexes of d's tables, with the table
// prefix removed so two installations compare equal.
func myShape(t *testing.T, ctx context.Context, db *sql.DB, d *mysql.Dialect) string {
	t.Helper()
	prefix := strings.Trim(d.OutboxTable(), "`")
	rows, err := db.QueryContext(ctx, `
SELECT CONCAT(table_name, '.', column_name, ':', column_type, ':', is_nullable, ':', COALESCE(generation_expression, ''))
FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name LIKE ? AND table_name NOT LIKE '%\_migrations'
UNION ALL
SELECT CONCAT(table_name, ' index ', index_name, ':', GROUP_CONCAT(column_name ORDER BY seq_in_index))
FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name LIKE ? AND table_name NOT LIKE '%\_migrations'
GROUP BY table_name, index_name
ORDER BY 1`, prefix+"%", prefix+"%")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.TrimPrefix(s, prefix))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}
