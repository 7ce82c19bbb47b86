package pgxv5

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestListenOnInvalidConnStringFailsListen(t *testing.T) {
	d := WrapPool(nil, ListenOn("postgres://%zz"))
	err := d.Listen(context.Background(), "ch", func() { t.Fatal("ready") }, func() {})
	if err == nil || !strings.Contains(err.Error(), "ListenOn") {
		t.Fatalf("got %v, want the parse error of ListenOn", err)
	}
	if err := WrapPool(nil, ListenConfig(nil)).Listen(context.Background(), "ch", func() {}, func() {}); err == nil {
		t.Fatal("a nil ListenConfig listened")
	}
}

func TestWrapConnCannotListen(t *testing.T) {
	if err := WrapConn(nil).Listen(context.Background(), "ch", func() {}, func() {}); err == nil || !strings.Contains(err.Error(), "WrapPool") {
		t.Fatalf("got %v", err)
	}
}

func TestPreparedStatementErrorsNameTheExecMode(t *testing.T) {
	for _, code := range []string{"26000", "42P05"} {
		pe := &pgconn.PgError{Code: code, Message: `prepared statement "stmtcache_1" does not exist`}
		err := mapErr(pe)
		var got *pgconn.PgError
		if !errors.As(err, &got) || got != pe {
			t.Fatalf("%s: the PgError is not kept: %v", code, err)
		}
		if !strings.Contains(err.Error(), "default_query_exec_mode=exec") {
			t.Fatalf("%s: no hint: %v", code, err)
		}
	}
	if err := mapErr(&pgconn.PgError{Code: "23505"}); strings.Contains(err.Error(), "default_query_exec_mode") {
		t.Fatalf("hint on an unrelated error: %v", err)
	}
}

func TestDropsConnection(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "25006"}, true}, // read_only_sql_transaction
		{fmt.Errorf("write: %w", &pgconn.PgError{Code: "57P01"}), true},
		{&pgconn.PgError{Code: "57P02"}, true},
		{&pgconn.PgError{Code: "57P03"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{&pgconn.PgError{Code: "40001"}, false},
		{&pgconn.ConnectError{Config: &pgconn.Config{}}, false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("%w: %w", context.Canceled, &net.OpError{Op: "read"}), false},
		{nil, false},
	} {
		if got := DropsConnection(c.err); got != c.want {
			t.Errorf("DropsConnection(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
