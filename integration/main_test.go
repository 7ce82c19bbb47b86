package integration_test

import (
	"context"
	"database/sql"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql keeps one opener goroutine per *sql.DB until Close;
		// pools shared by the whole package are closed at exit.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

var sqlTxOptions = sql.TxOptions{}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
