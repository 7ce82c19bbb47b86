package dialecttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Env returns the value of the environment variable name, or def when it
// is unset or empty.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// InCI reports whether a missing service must fail the run rather than
// skip the test.
func InCI() bool { return os.Getenv("CI") != "" && os.Getenv("CI") != "false" }

// Unavailable fails the test in CI and skips it elsewhere, naming the
// variable that points the tests at service.
func Unavailable(t testing.TB, service, variable string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is required in CI but unreachable: %v", service, err)
	}
	t.Skipf("%s unreachable (%v); start it or set %s", service, err, variable)
}

// UniqueName returns prefix followed by random hex, a valid identifier.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// Ctx returns a context that ends with the test, or after timeout.
func Ctx(t testing.TB, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// Migrate creates the tables of d through db, or fails the test.
func Migrate(t testing.TB, db sqladapters.DB, d sqladapters.Dialect) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sqladapters.Migrate(ctx, db, d); err != nil {
		t.Fatalf("migrate: %v", err)
	}
}
