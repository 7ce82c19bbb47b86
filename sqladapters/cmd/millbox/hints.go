package main

import (
	"cmp"
	"flag"
	"io"
	"net/url"
	"regexp"
	"slices"
	"strings"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A hint tells the user a command to run next. It repeats the connection
// flags the user gave, so that pasted as shown it runs on the same tables,
// but never a password: a DSN shows with its password masked.

// mask replaces a password wherever the command shows a DSN.
const mask = "xxxxx"

// connectionFlags are the flags that say which tables a command works on.
var connectionFlags = []string{"schema", "outbox-table", "inbox-table", "fleet-schema", "fleet-prefix", "connect-timeout", "dsn"}

// hint returns "millbox <command>" followed by the connection flags the
// user gave, each value quoted for a shell, and a note when the DSN shown
// lost its password.
func (c *common) hint(command string) string {
	var b strings.Builder
	b.WriteString("millbox " + command)
	masked := false
	if c.fs != nil {
		for _, name := range connectionFlags {
			f := c.fs.Lookup(name)
			if f == nil || !c.set(name) {
				continue
			}
			v := f.Value.String()
			if name == "dsn" {
				shown := redact(v, secrets(v))
				masked = shown != v
				v = shown
			}
			b.WriteString(" --" + name + " " + shellQuote(v))
		}
	}
	if masked {
		b.WriteString(" (with your password for " + mask + ")")
	}
	return b.String()
}

// set reports whether the user gave the flag name.
func (c *common) set(name string) bool {
	found := false
	c.fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
}

// shellQuote quotes v for a POSIX shell when it needs it.
func shellQuote(v string) string {
	if v != "" && strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=@%+,-") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}

var (
	// keywordPassword finds password and sslpassword values of libpq's
	// keyword/value form, quoted or not.
	keywordPassword = regexp.MustCompile(`(?i)(?:^|\s)(?:ssl)?password\s*=\s*(?:'((?:[^'\\]|\\.)*)'|([^\s']+))`)
	// queryPassword finds them in a URL's query.
	queryPassword = regexp.MustCompile(`(?i)[?&](?:ssl)?password=([^&#]*)`)
)

// secrets returns the passwords dsn may hold, longest first: what the
// drivers' parsers read from it, and what the usual shapes of a password
// in a DSN hold where dsn does not parse. The command never prints a
// DSN; this is the net under that rule for whatever a driver's message
// may repeat.
func secrets(dsn string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 3 && !slices.Contains(out, s) {
			out = append(out, s)
		}
		if d, err := url.PathUnescape(s); err == nil && d != s && len(d) >= 3 && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	if cfg, err := pgxpool.ParseConfig(dsn); err == nil {
		add(cfg.ConnConfig.Password)
	}
	rest := dsn
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	if cfg, err := mysqldrv.ParseDSN(rest); err == nil {
		add(cfg.Passwd)
	}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		p, _ := u.User.Password()
		add(p)
	}
	for _, m := range keywordPassword.FindAllStringSubmatch(dsn, -1) {
		add(cmp.Or(m[1], m[2]))
	}
	for _, m := range queryPassword.FindAllStringSubmatch(dsn, -1) {
		add(m[1])
	}
	// user:password@ at the start of a URL's authority or of a MySQL DSN,
	// where the password may itself hold an @.
	if at := strings.LastIndex(rest, "@"); at > 0 {
		if colon := strings.IndexByte(rest[:at], ':'); colon >= 0 && !strings.ContainsAny(rest[:colon], "/(") {
			add(rest[colon+1 : at])
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redact masks every secret in s.
func redact(s string, secrets []string) string {
	for _, p := range secrets {
		s = strings.ReplaceAll(s, p, mask)
	}
	return s
}

// redactingWriter masks the secrets in everything written through it. The
// command writes each message with one call, so a secret is never split
// between two.
type redactingWriter struct {
	w       io.Writer
	secrets []string
}

func (r redactingWriter) Write(p []byte) (int, error) {
	if len(r.secrets) == 0 {
		return r.w.Write(p)
	}
	if _, err := io.WriteString(r.w, redact(string(p), r.secrets)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// dsnsIn returns the values of --dsn and the DSNs of --server in args,
// $MILLBOX_DSN and the DSNs of $MILLBOX_FLEET_SERVERS.
func dsnsIn(args []string, getenv func(string) string) []string {
	out := []string{getenv("MILLBOX_DSN")}
	for line := range strings.SplitSeq(getenv(serversEnv), "\n") {
		if _, dsn, ok := strings.Cut(line, "="); ok {
			out = append(out, dsn)
		}
	}
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "dsn" && name != "server") {
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				continue
			}
			value = args[i+1]
		}
		if name == "server" {
			// name=DSN: the DSN follows the server's name.
			_, value, _ = strings.Cut(value, "=")
		}
		out = append(out, value)
	}
	return out
}
