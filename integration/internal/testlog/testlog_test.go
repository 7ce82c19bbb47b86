package testlog

import (
	"bytes"
	"errors"
	"log"
	"log/slog"
	"strings"
	"testing"
)

// fakeM stands for TestMain's *testing.M: its tests log through the
// default loggers and end with code.
type fakeM struct {
	code  int
	lines int
}

func (m fakeM) Run() int {
	for i := range m.lines {
		slog.Error("millbox forwarder: destination unavailable", "n", i)
	}
	log.Print("through the log package")
	return m.code
}

func captureStderr(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old := stderr
	stderr = &buf
	t.Cleanup(func() { stderr = old })
	return &buf
}

func TestDefaultToFailuresHidesPassingRuns(t *testing.T) {
	out := captureStderr(t)
	before := slog.Default()
	if code := DefaultToFailures(fakeM{code: 0, lines: 3}).Run(); code != 0 {
		t.Fatalf("code %d, want the tests' 0", code)
	}
	if out.Len() != 0 {
		t.Fatalf("a passing run printed:\n%s", out)
	}
	if slog.Default() != before {
		t.Fatal("the default logger was not restored")
	}
}

func TestDefaultToFailuresShowsFailedRuns(t *testing.T) {
	out := captureStderr(t)
	if code := DefaultToFailures(fakeM{code: 1, lines: 3}).Run(); code != 1 {
		t.Fatalf("code %d, want the tests' 1", code)
	}
	got := out.String()
	for _, want := range []string{"shown because a test failed", "level=ERROR", "n=0", "n=2", "through the log package"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in the output of a failed run:\n%s", want, got)
		}
	}
}

func TestDefaultToFailuresKeepsTheLastLines(t *testing.T) {
	out := captureStderr(t)
	DefaultToFailures(fakeM{code: 1, lines: maxLines + 10}).Run()
	got := out.String()
	// maxLines kept: the last maxLines-1 errors and the log line.
	if !strings.Contains(got, "(the last 5000; 11 before them left out)") ||
		strings.Contains(got, " n=10 ") || !strings.Contains(got, " n=11\n") {
		t.Fatalf("output of %d lines does not keep the last %d:\n%.500s", maxLines+11, maxLines, got)
	}
}

func TestWriterPrefixesLines(t *testing.T) {
	var buf bytes.Buffer
	w := &prefixWriter{w: &buf, prefix: "child: "}
	for _, s := range []string{"one\ntw", "o\n", "three\nfour\n"} {
		if n, err := w.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if want := "child: one\nchild: two\nchild: three\nchild: four\n"; buf.String() != want {
		t.Fatalf("wrote %q, want %q", buf.String(), want)
	}
}

// A component the test left running may log after the test ended: the
// line goes to standard error instead of panicking in t.Output.
func TestLoggerAfterTheTest(t *testing.T) {
	out := captureStderr(t)
	var logger *slog.Logger
	t.Run("sub", func(t *testing.T) {
		logger = Slog(t)
		logger.Info("during")
	})
	logger.Error("late", "error", errors.New("boom"))
	if got := out.String(); !strings.Contains(got, "TestLoggerAfterTheTest/sub (logged after the test ended):") ||
		!strings.Contains(got, "msg=late") || strings.Contains(got, "during") {
		t.Fatalf("standard error: %q", got)
	}
}
