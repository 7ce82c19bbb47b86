// Testreport runs go test -json with the given arguments and prints what
// matters while it runs and after:
//
//   - one line per package when it ends: passed, failed and skipped tests;
//   - every failed test with its output, as soon as it fails (the output of
//     tests that pass stays hidden, as without -v);
//   - a progress line when nothing was printed for -progress, naming the
//     tests that run longest;
//   - at the end, the counts and every skipped test with its reason.
//
// Usage:
//
//	go run .ci/testreport/main.go [-progress 30s] [-json FILE] [-summary FILE] [-name NAME] [-trim PREFIX] -- [go test flags] packages
//
// -json keeps the complete event stream, -summary appends the final counts,
// skips and failures to a file (.ci/test prints them after all stages).
// The exit status is 1 when a test or a package failed or go test did.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// event is a line of go test -json (go doc cmd/test2json).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	ImportPath  string // build-output and build-fail
	FailedBuild string
}

// maxFailLines bounds the output printed for one failed test; the -json
// file has all of it.
const maxFailLines = 400

type test struct {
	pkg, name string
	started   time.Time // the last run or cont
	paused    bool
	output    []string
}

type pkg struct {
	passed, failed, skipped int
	started                 time.Time
	output                  []string // lines outside any test
}

type skip struct{ pkg, name, reason string }

type report struct {
	mu        sync.Mutex
	out       io.Writer
	start     time.Time
	lastPrint time.Time
	pkgs      map[string]*pkg
	tests     map[[2]string]*test
	build     map[string][]string // build output per import path
	skips     []skip
	failures  []string
	failedPkg []string
	passed    int
}

func main() {
	progress := flag.Duration("progress", 30*time.Second, "print a progress line when nothing was printed for this long")
	jsonFile := flag.String("json", "", "write the go test -json stream to this `file`")
	summaryFile := flag.String("summary", "", "append the final summary to this `file`")
	name := flag.String("name", "tests", "`name` of this run in the summary")
	flag.StringVar(&trimPrefix, "trim", "", "leave this `prefix` out of the import paths printed")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: testreport [flags] -- [go test flags] packages")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	os.Exit(run(*name, *progress, *jsonFile, *summaryFile, flag.Args()))
}

func run(name string, progress time.Duration, jsonFile, summaryFile string, args []string) int {
	cmd := exec.Command("go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 1
	}
	var raw io.Writer = io.Discard
	if jsonFile != "" {
		f, err := os.Create(jsonFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testreport:", err)
			return 1
		}
		defer f.Close()
		w := bufio.NewWriter(f)
		defer w.Flush()
		raw = w
	}
	// The go command and the test binaries get the terminal's signals
	// themselves; testreport waits for them to end and reports.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	r := &report{out: os.Stdout, start: time.Now(), lastPrint: time.Now(),
		pkgs: map[string]*pkg{}, tests: map[[2]string]*test{}, build: map[string][]string{}}
	fmt.Fprintf(r.out, "go test -json %s\n", strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		return 1
	}
	done := make(chan struct{})
	go r.tick(progress, done)
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		_, _ = raw.Write(line)
		_, _ = raw.Write([]byte{'\n'})
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			r.println(string(line)) // not an event: pass it on
			continue
		}
		r.handle(e)
	}
	scanErr := sc.Err()
	waitErr := cmd.Wait()
	close(done)
	summary := r.summary(name, waitErr, scanErr)
	fmt.Fprint(r.out, "\n"+summary)
	if summaryFile != "" {
		if f, err := os.OpenFile(summaryFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, _ = f.WriteString(summary)
			_ = f.Close()
		}
	}
	if waitErr != nil || scanErr != nil || len(r.failures) > 0 || len(r.failedPkg) > 0 {
		return 1
	}
	return 0
}

func (r *report) println(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(r.out, s)
	r.lastPrint = time.Now()
}

// framing matches the lines the testing package prints around a test.
var framing = regexp.MustCompile(`^\s*(=== (RUN|PAUSE|CONT|NAME)\s+|--- (PASS|FAIL|SKIP): )(\S+)`)

// own returns the lines of output without the framing lines of test name
// (a child process's framing lines are output like any other).
func own(output []string, name string) []string {
	lines := strings.Split(strings.TrimRight(strings.Join(output, ""), "\n"), "\n")
	return slices.DeleteFunc(lines, func(l string) bool {
		m := framing.FindStringSubmatch(l)
		return strings.TrimSpace(l) == "" || m != nil && m[4] == name
	})
}

func (r *report) handle(e event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Action {
	case "build-output":
		r.build[e.ImportPath] = append(r.build[e.ImportPath], e.Output)
		return
	case "build-fail":
		return // the packages that needed it fail, and print its output
	}
	p := r.pkgs[e.Package]
	if p == nil {
		p = &pkg{started: e.Time}
		r.pkgs[e.Package] = p
	}
	if e.Test == "" {
		r.packageEvent(p, e)
		return
	}
	key := [2]string{e.Package, e.Test}
	t := r.tests[key]
	if t == nil {
		t = &test{pkg: e.Package, name: e.Test, started: e.Time}
		r.tests[key] = t
	}
	switch e.Action {
	case "run", "cont":
		t.started, t.paused = e.Time, false
	case "pause":
		t.paused = true
	case "output":
		t.output = append(t.output, e.Output)
	case "pass":
		p.passed++
		r.passed++
		delete(r.tests, key)
	case "skip":
		p.skipped++
		reason := "(no reason given)"
		if lines := own(t.output, t.name); len(lines) > 0 {
			reason = strings.TrimSpace(lines[len(lines)-1])
		}
		r.skips = append(r.skips, skip{e.Package, e.Test, reason})
		delete(r.tests, key)
	case "fail":
		p.failed++
		r.failures = append(r.failures, short(e.Package)+" "+e.Test)
		r.printFailure(t, fmt.Sprintf("--- FAIL: %s (%.2fs)", e.Test, e.Elapsed))
		delete(r.tests, key)
	}
}

func (r *report) packageEvent(p *pkg, e event) {
	switch e.Action {
	case "start":
		p.started = e.Time
	case "output":
		p.output = append(p.output, e.Output)
	case "skip": // no test files
	case "pass", "fail":
		counts := fmt.Sprintf("%d passed", p.passed)
		if p.failed > 0 {
			counts += fmt.Sprintf(", %d failed", p.failed)
		}
		if p.skipped > 0 {
			counts += fmt.Sprintf(", %d skipped", p.skipped)
		}
		status := "ok  "
		if e.Action == "fail" {
			status = "FAIL"
			r.failedPkg = append(r.failedPkg, short(e.Package))
		}
		if e.FailedBuild != "" {
			counts = "build failed"
		}
		r.printf("%s  %-28s %-34s %s\n", status, short(e.Package), counts, round(time.Duration(e.Elapsed*float64(time.Second))))
		if out, ok := r.build[e.FailedBuild]; ok {
			for _, l := range own(out, "") {
				r.printf("      %s\n", l)
			}
			delete(r.build, e.FailedBuild)
		}
		if e.Action == "fail" {
			// A panic, a timeout or TestMain's own checks (goleak) fail
			// the package outside any test: show what it printed and
			// the output of the tests it interrupted.
			for _, l := range own(p.output, "") {
				if l != "FAIL" && l != "PASS" && !strings.HasPrefix(l, "FAIL\t") && !strings.HasPrefix(l, "ok  \t") {
					r.printf("      %s\n", l)
				}
			}
			for key, t := range r.tests {
				if key[0] == e.Package {
					r.failures = append(r.failures, short(t.pkg)+" "+t.name+" (unfinished)")
					r.printFailure(t, "--- unfinished: "+t.name)
					delete(r.tests, key)
				}
			}
		}
		p.output = nil
	}
}

func (r *report) printFailure(t *test, header string) {
	lines := own(t.output, t.name)
	if len(lines) == 0 && strings.HasPrefix(header, "--- FAIL") && r.failedSubtest(t) {
		return // its failed subtests said it
	}
	r.printf("%s  %s\n", header, short(t.pkg))
	if len(lines) > maxFailLines {
		r.printf("      (%d earlier lines left out; the -json file has them)\n", len(lines)-maxFailLines)
		lines = lines[len(lines)-maxFailLines:]
	}
	for _, l := range lines {
		r.printf("      %s\n", l)
	}
}

func (r *report) failedSubtest(t *test) bool {
	prefix := short(t.pkg) + " " + t.name + "/"
	for _, f := range r.failures {
		if strings.HasPrefix(f, prefix) {
			return true
		}
	}
	return false
}

func (r *report) printf(format string, args ...any) {
	fmt.Fprintf(r.out, format, args...)
	r.lastPrint = time.Now()
}

// tick prints a progress line whenever nothing was printed for every
// (checking each second, so no gap is longer).
func (r *report) tick(every time.Duration, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			r.mu.Lock()
			if now.Sub(r.lastPrint) >= every-time.Second {
				r.printf("..... %s  %s so far; running: %s\n", round(now.Sub(r.start)), r.counts(), r.running(now))
			}
			r.mu.Unlock()
		}
	}
}

// running names the tests that run longest, leaves only: a test waiting
// for its subtests is not named.
func (r *report) running(now time.Time) string {
	var active []*test
	for _, t := range r.tests {
		if !t.paused {
			active = append(active, t)
		}
	}
	leaves := slices.DeleteFunc(slices.Clone(active), func(t *test) bool {
		return slices.ContainsFunc(active, func(c *test) bool {
			return c.pkg == t.pkg && strings.HasPrefix(c.name, t.name+"/")
		})
	})
	if len(leaves) == 0 {
		return "building or starting packages"
	}
	slices.SortFunc(leaves, func(a, b *test) int { return a.started.Compare(b.started) })
	var names []string
	for i, t := range leaves {
		if i == 3 {
			names = append(names, fmt.Sprintf("and %d more", len(leaves)-3))
			break
		}
		names = append(names, fmt.Sprintf("%s %s (%s)", short(t.pkg), t.name, round(now.Sub(t.started))))
	}
	return strings.Join(names, ", ")
}

func (r *report) counts() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", r.passed, len(r.failures), len(r.skips))
}

func (r *report) summary(name string, waitErr, scanErr error) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s in %s\n", name, r.counts(), round(time.Since(r.start)))
	if len(r.skips) > 0 {
		fmt.Fprintf(&b, "  skipped:\n")
		for _, s := range r.skips {
			fmt.Fprintf(&b, "    %s %s: %s\n", short(s.pkg), s.name, s.reason)
		}
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(&b, "  failed:\n")
		for _, f := range r.failures {
			fmt.Fprintf(&b, "    %s\n", f)
		}
	}
	if len(r.failedPkg) > 0 {
		fmt.Fprintf(&b, "  failed packages: %s\n", strings.Join(r.failedPkg, " "))
	}
	var exit *exec.ExitError
	if waitErr != nil && (!errors.As(waitErr, &exit) || len(r.failures)+len(r.failedPkg) == 0) {
		fmt.Fprintf(&b, "  go test: %v\n", waitErr)
	}
	if scanErr != nil {
		fmt.Fprintf(&b, "  reading go test -json: %v\n", scanErr)
	}
	return b.String()
}

// trimPrefix is left out of the import paths printed.
var trimPrefix string

// short is path without trimPrefix.
func short(path string) string {
	if s, ok := strings.CutPrefix(path, trimPrefix); ok && s != "" {
		return s
	}
	return path
}

func round(d time.Duration) string {
	if d < time.Minute {
		return fmt.Sprintf("%.1fs", d.Seconds())
	}
	return d.Round(time.Second).String()
}
