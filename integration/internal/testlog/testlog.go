// Package testlog gives tests loggers whose lines go to the test's own log,
// which go test shows only when the test fails (or with -v): the errors a
// test provokes on purpose (a destination that refuses, a database taken
// away) stay out of the output of a passing run and are at hand when a run
// fails.
//
// Components take a logger in their Config (forwarder.Config.Logger and
// the like); a test passes Logger(t) there. Code that logs through
// log/slog's default logger, and cannot be given one, is covered by
// DefaultToFailures in TestMain.
package testlog

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

// Level is the lowest level the loggers of this package write.
const Level = slog.LevelInfo

// Logger returns a Watermill logger that writes Level and above to t's
// log. Lines logged after t and its cleanups ended (a goroutine the test
// left running) go to standard error, marked with the test's name.
func Logger(t testing.TB) watermill.LoggerAdapter {
	return watermill.NewSlogLogger(Slog(t))
}

// Slog returns a *slog.Logger that writes Level and above to t's log, as
// Logger does.
func Slog(t testing.TB) *slog.Logger {
	return slog.New(handler(newTestWriter(t)))
}

// Writer returns a writer whose lines go to t's log, each after prefix:
// for the output of a process a test starts, shown when the test fails.
// Like Logger's, lines written after t ended go to standard error.
func Writer(t testing.TB, prefix string) io.Writer {
	return &prefixWriter{w: newTestWriter(t), prefix: prefix}
}

// prefixWriter writes whole lines, each after prefix.
type prefixWriter struct {
	mu      sync.Mutex
	w       io.Writer
	prefix  string
	partial []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partial = append(p.partial, b...)
	for {
		i := bytes.IndexByte(p.partial, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := append([]byte(p.prefix), p.partial[:i+1]...)
		p.partial = p.partial[i+1:]
		if _, err := p.w.Write(line); err != nil {
			return len(b), err
		}
	}
}

func handler(w io.Writer) slog.Handler {
	return slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: Level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.String(slog.TimeKey, a.Value.Time().Format("15:04:05.000"))
			}
			return a
		},
	})
}

// testWriter writes to t.Output until t's cleanups run: the cleanup it
// registers first runs last, after those of the components that log.
type testWriter struct {
	mu    sync.Mutex
	name  string
	out   io.Writer
	ended bool
}

func newTestWriter(t testing.TB) *testWriter {
	w := &testWriter{name: t.Name(), out: t.Output()}
	t.Cleanup(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.ended = true
	})
	return w
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		_, _ = fmt.Fprintf(stderr, "%s (logged after the test ended): %s", w.name, p)
		return len(p), nil
	}
	return w.out.Write(p)
}

// stderr is where lines go that no test log takes.
var stderr io.Writer = os.Stderr

// TestingM is what TestMain's *testing.M offers, and what
// goleak.VerifyTestMain takes.
type TestingM interface {
	Run() int
}

// DefaultToFailures makes log/slog's default logger (and the log
// package's, which slog.SetDefault routes through it) keep its lines
// while m runs, and print them to standard error after the tests only if
// one failed. The lines of tests running in parallel are not told apart:
// the output of a failed run holds all of them, last maxLines at most.
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(testlog.DefaultToFailures(m)) }
func DefaultToFailures(m TestingM) TestingM {
	return &failuresOnly{m: m}
}

// maxLines bounds the lines DefaultToFailures keeps.
const maxLines = 5000

type failuresOnly struct {
	m TestingM

	mu      sync.Mutex
	lines   [][]byte
	dropped int
}

func (f *failuresOnly) Run() int {
	previous, logOutput, logFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(handler(f)))
	code := f.m.Run()
	slog.SetDefault(previous)
	log.SetOutput(logOutput)
	log.SetFlags(logFlags)
	f.mu.Lock()
	defer f.mu.Unlock()
	if code != 0 && len(f.lines) > 0 {
		fmt.Fprintf(stderr, "--- the default logger's lines during the tests, shown because a test failed")
		if f.dropped > 0 {
			fmt.Fprintf(stderr, " (the last %d; %d before them left out)", len(f.lines), f.dropped)
		}
		fmt.Fprintln(stderr, ":")
		for _, l := range f.lines {
			_, _ = stderr.Write(l)
		}
	}
	return code
}

func (f *failuresOnly) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.lines) == maxLines {
		f.lines = f.lines[1:]
		f.dropped++
	}
	f.lines = append(f.lines, bytes.Clone(p))
	return len(p), nil
}
