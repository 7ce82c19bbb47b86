package integration_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/goleak"

	"github.com/millbox/millbox/integration/internal/testlog"
	"github.com/millbox/millbox/integration/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(eosChildEnv) != "" {
		if err := eosChild(); err != nil {
			fmt.Fprintln(os.Stderr, "exactly-once forwarder process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if name := os.Getenv(crashChildEnv); name != "" {
		if err := forwarderCrashChild(name); err != nil {
			fmt.Fprintln(os.Stderr, "forwarder process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(fleetChildEnv) != "" {
		if err := fleetChild(); err != nil {
			fmt.Fprintln(os.Stderr, "fleet instance process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Components the tests start without a logger of the test's own log
	// through slog's default logger; its lines are shown when a test fails.
	goleak.VerifyTestMain(testenv.PostgresPairs(testlog.DefaultToFailures(m)),
		// database/sql keeps one opener goroutine per *sql.DB until Close;
		// pools shared by the whole package are closed at exit.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// Watermill's universal Pub/Sub tests leave the goroutines of
		// their subscriber multiplier blocked on a channel nobody reads.
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func2"),
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill/internal/subscriber.(*multiplier).Subscribe.func3"),
		// watermill-redisstream's reader outlives the subscriber's Close
		// by half a second when its last read failed: it sleeps before it
		// looks at the close signal.
		goleak.IgnoreAnyFunction("github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream.(*Subscriber).read"),
	)
}

var sqlTxOptions = sql.TxOptions{}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
