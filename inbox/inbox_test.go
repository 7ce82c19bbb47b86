package inbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/millbox/millbox/inbox"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestValidateKey(t *testing.T) {
	for _, c := range []struct {
		value string
		want  string // "" = valid
	}{
		{"billing", ""},
		{"żółć ✓", ""},
		{strings.Repeat("x", inbox.MaxKeyBytes), ""},
		{"", "is empty"},
		{strings.Repeat("x", inbox.MaxKeyBytes+1), "longer than"},
		{"a\xffb", "not valid UTF-8"},
		{"a\x00b", "NUL"},
	} {
		err := inbox.ValidateKey("message id", c.value)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.value, err)
		case c.want != "" && (!errors.Is(err, inbox.ErrInvalidKey) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "message id")):
			t.Errorf("%q: want ErrInvalidKey naming the field and saying %q, got %v", c.value, c.want, err)
		}
	}
}

func TestNewNeedsDialect(t *testing.T) {
	if _, err := inbox.New(inbox.Config{}); !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.Dialect") {
		t.Fatalf("want ErrInvalidConfig naming Dialect, got %v", err)
	}
	if _, err := inbox.New(inbox.Config{Dialect: postgres.MustNew(postgres.Options{})}); err != nil {
		t.Fatal(err)
	}
}

func TestRecordNeedsTx(t *testing.T) {
	ib, err := inbox.New(inbox.Config{Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ib.Record(context.Background(), nil, "billing", "m1"); !errors.Is(err, inbox.ErrNoTx) {
		t.Fatalf("want ErrNoTx, got %v", err)
	}
}

func TestCleanerConfig(t *testing.T) {
	db := stdsql.WrapDB(nil) // never used: these configs fail or the cleaner never runs
	d := postgres.MustNew(postgres.Options{})
	for _, c := range []struct {
		cfg   inbox.CleanerConfig
		field string
	}{
		{inbox.CleanerConfig{Dialect: d}, "DB"},
		{inbox.CleanerConfig{DB: db}, "Dialect"},
		{inbox.CleanerConfig{DB: db, Dialect: d, Retention: 59 * time.Second}, "Retention"},
		{inbox.CleanerConfig{DB: db, Dialect: d, BatchSize: -1}, "BatchSize"},
		{inbox.CleanerConfig{DB: db, Dialect: d, Interval: -1}, "Interval"},
		{inbox.CleanerConfig{DB: db, Dialect: d, CloseTimeout: -1}, "CloseTimeout"},
	} {
		if _, err := inbox.NewCleaner(c.cfg); !errors.Is(err, inbox.ErrInvalidConfig) || !strings.Contains(err.Error(), "CleanerConfig."+c.field) {
			t.Errorf("want ErrInvalidConfig naming %s, got %v", c.field, err)
		}
	}
	if _, err := inbox.NewCleaner(inbox.CleanerConfig{DB: db, Dialect: d, Retention: inbox.MinRetention}); err != nil {
		t.Fatalf("defaults and MinRetention rejected: %v", err)
	}
}

func TestCleanerLifecycleWithoutRun(t *testing.T) {
	c, err := inbox.NewCleaner(inbox.CleanerConfig{DB: stdsql.WrapDB(nil), Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Running():
		t.Fatal("Running before Run")
	default:
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Run(context.Background()); !errors.Is(err, inbox.ErrClosed) {
		t.Fatalf("Run after Close: want ErrClosed, got %v", err)
	}
}
