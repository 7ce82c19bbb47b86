package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// usageError is a mistake in the command line; run prints it with a hint
// and exits with exitUsage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error {
	return usageError{fmt.Sprintf(format, args...)}
}

// env is what every command gets.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

// common holds the flags every command that touches the database accepts.
type common struct {
	dsn     string
	tables  tableFlags
	timeout time.Duration
	// fs is the command's flag set, which hints read the flags given
	// from.
	fs *flag.FlagSet
}

func (c *common) register(fs *flag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.dsn, "dsn", "", "database URL or DSN (default $MILLBOX_DSN); the form chooses the database, see 'millbox help'")
	fs.StringVar(&c.tables.schema, "schema", "", "Postgres schema or MySQL database holding the tables (default: the connection's)")
	fs.StringVar(&c.tables.outbox, "outbox-table", "", "outbox table name (default millbox_outbox); its _leases, _members and _migrations tables follow it")
	fs.StringVar(&c.tables.inbox, "inbox-table", "", "inbox table name (default millbox_inbox)")
	fs.DurationVar(&c.timeout, "connect-timeout", 10*time.Second, "how long to wait for the database to answer")
}

// run is the whole command: it parses args, runs one command and returns
// the exit status. Nothing it writes to stderr holds a password of a DSN
// it was given.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var hidden []string
	for _, dsn := range dsnsIn(args, os.Getenv) {
		hidden = append(hidden, secrets(dsn)...)
	}
	stderr = redactingWriter{w: stderr, secrets: hidden}
	e := env{stdout: stdout, stderr: stderr, getenv: os.Getenv}
	err := dispatch(ctx, e, args)
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	}
	fmt.Fprintln(stderr, "millbox: "+errorText(err))
	var ue usageError
	if errors.As(err, &ue) || errors.Is(err, errBadDSN) {
		return exitUsage
	}
	return exitError
}

// errorText is err's text with the "millbox: " of the errors it wraps left
// out: run writes the prefix once.
func errorText(err error) string {
	return strings.ReplaceAll(err.Error(), "millbox: ", "")
}

func dispatch(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, mainUsage)
		return usagef("no command given")
	}
	args = commandFirst(args)
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "-help", "--help":
		return help(ctx, e, rest)
	case "version", "--version":
		return version(e, rest)
	case "migrate":
		return migrateCmd(ctx, e, rest)
	case "status":
		return statusCmd(ctx, e, rest)
	case "dead":
		return deadCmd(ctx, e, rest)
	case "prune":
		return pruneCmd(ctx, e, rest)
	case "partitions":
		return partitionsCmd(ctx, e, rest)
	}
	return usagef("unknown command %q; run 'millbox help'", cmd)
}

// commands are the names dispatch knows.
var commands = []string{"help", "version", "migrate", "status", "dead", "prune", "partitions"}

// commandFirst moves the command name to the front when flags come before
// it (millbox --dsn ... status), since every command parses them.
func commandFirst(args []string) []string {
	if !strings.HasPrefix(args[0], "-") || slices.Contains([]string{"-h", "-help", "--help", "--version"}, args[0]) {
		return args
	}
	for i, a := range args {
		if slices.Contains(commands, a) {
			return append(append([]string{a}, args[:i]...), args[i+1:]...)
		}
	}
	return args
}

// parse parses args with fs, allowing flags after positional arguments
// (millbox dead show 12 --json), and returns the positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// newFlagSet returns a flag set whose -h prints usage (a text with
// examples) and the flags.
func newFlagSet(e env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprint(e.stdout, usage)
		fmt.Fprintln(e.stdout, "\nFlags:")
		fs.SetOutput(e.stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// connect parses the DSN, builds the dialect and opens the database.
func (c *common) connect(ctx context.Context, e env, create bool) (*session, error) {
	t, d, err := c.target(e)
	if err != nil {
		return nil, err
	}
	cn, err := c.open(ctx, t, create)
	if err != nil {
		return nil, err
	}
	o, err := ops.New(cn.db, d)
	if err != nil {
		cn.close()
		return nil, err
	}
	return &session{common: c, conn: cn, t: t, d: d, o: o}, nil
}

// target parses the DSN and builds the dialect without connecting.
func (c *common) target(e env) (target, sqladapters.Dialect, error) {
	dsn := c.dsn
	if dsn == "" {
		dsn = e.getenv("MILLBOX_DSN")
	}
	t, err := parseDSN(dsn)
	if err != nil {
		return target{}, nil, err
	}
	d, err := c.tables.dialect(t.kind)
	if err != nil {
		return target{}, nil, usageError{err.Error()}
	}
	return t, d, nil
}

// session is a command's open database.
type session struct {
	*common
	*conn
	t target
	d sqladapters.Dialect
	o *ops.Ops
}

// schema returns the schema (or database, or file) the tables are looked
// for in, as messages name it: `schema "app" of postgres at db:5432/app`.
func (s *session) schema(ctx context.Context) string {
	word := map[string]string{"postgres": "schema", "mysql": "database"}[s.t.kind]
	if s.t.kind == "sqlite" {
		return "sqlite file " + s.t.where
	}
	name, err := s.d.CurrentSchema(ctx, s.db)
	switch {
	case err != nil:
		name = "(unknown: " + err.Error() + ")"
	case name == "" && s.t.kind == "postgres":
		name = "(none of the connection's search_path exists)"
	case name == "":
		name = "(none: the DSN names no database)"
	default:
		name = strconv.Quote(name)
	}
	return word + " " + name + " of " + s.t.kind + " at " + s.t.where
}

// explain turns the errors a user can act on into what to do: missing
// tables say where they were looked for and how to create them, a missing
// dead letter where it was looked for.
func (s *session) explain(ctx context.Context, err error) error {
	var mt *sqladapters.MissingTableError
	switch {
	case errors.As(err, &mt):
		return &tablesMissingError{err: err, msg: fmt.Sprintf("the millbox tables are missing in %s (looked for %s)\n"+
			"create them with: %s\nor apply the output of: %s\n(%v)",
			s.schema(ctx), tableName(s.d.OutboxTable()), s.hint("migrate up"), s.hint("migrate sql"), mt.Err)}
	case errors.Is(err, ops.ErrNotFound):
		return fmt.Errorf("%w in %s", err, s.schema(ctx))
	}
	return err
}

// tablesMissingError reports missing tables with what to do about them.
type tablesMissingError struct {
	msg string
	err error
}

func (e *tablesMissingError) Error() string { return e.msg }
func (e *tablesMissingError) Unwrap() error { return e.err }

func version(e env, args []string) error {
	if len(args) > 0 {
		return usagef("version takes no arguments")
	}
	v, goVersion := "(devel)", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
	}
	fmt.Fprintf(e.stdout, "millbox %s %s\n", v, goVersion)
	return nil
}

// parseAge reads a duration that may start with days: "7d", "36h", "1d12h",
// "90m".
func parseAge(s string) (time.Duration, error) {
	var days time.Duration
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q: use forms such as 30d, 36h, 1d12h or 90m", s)
		}
		days = time.Duration(n) * 24 * time.Hour
		s = s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: use forms such as 30d, 36h, 1d12h or 90m", s)
	}
	return days + d, nil
}

// ageFlag is a flag.Value holding a parseAge duration.
type ageFlag struct{ d *time.Duration }

func (a ageFlag) String() string {
	if a.d == nil || *a.d == 0 {
		return ""
	}
	return formatAge(*a.d)
}

func (a ageFlag) Set(s string) error {
	d, err := parseAge(s)
	if err != nil {
		return err
	}
	if d <= 0 {
		return fmt.Errorf("duration %q must be positive", s)
	}
	*a.d = d
	return nil
}

// formatAge renders d for people: 45s, 12m30s, 5h3m, 3d4h.
func formatAge(d time.Duration) string {
	switch {
	case d < time.Second:
		return "<1s"
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%ds", d/time.Minute, d%time.Minute/time.Second)
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%dm", d/time.Hour, d%time.Hour/time.Minute)
	}
	d = d.Round(time.Hour)
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// count renders n with its noun, plural when n is not 1: "1 dead letter",
// "3 dead letters".
func count(n int64, noun string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
