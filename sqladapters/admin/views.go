package admin

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html/template"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/millbox/millbox/sqladapters/ops"
)

var funcs = template.FuncMap{
	"age":  formatAge,
	"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	// short shows the start of a text from the database on one line,
	// its control characters escaped.
	"short": func(n int, s string) string { return shorten(n, ops.EscapeControls(s, false)) },
	// text shows a text from the database as it is but for its control
	// characters, escaped.
	"text": func(s string) string { return ops.EscapeControls(s, true) },
	"num":  func(n int64) string { return strconv.FormatInt(n, 10) },
	"secs": func(d time.Duration) int64 { return int64(d / time.Second) },
}

// formatAge renders a duration the way an operator reads it: "4s",
// "3m 12s", "2h 5m", "3d 4h".
func formatAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64(d / time.Second)
	switch {
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm %ds", s/60, s%60)
	case s < 86400:
		return fmt.Sprintf("%dh %dm", s/3600, s%3600/60)
	}
	return fmt.Sprintf("%dd %dh", s/86400, s%86400/3600)
}

// shorten cuts s to n runes, on a rune boundary, for table cells and
// attributes; the full text is on the message page.
func shorten(n int, s string) string {
	if len(s) <= n || utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for range n {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i] + "…"
}

// field is a long text from the database prepared for a message page: at
// most max bytes of it unless the page shows everything, its control
// characters escaped.
type field struct {
	Text  string
	Size  int
	Shown int
}

// Cut reports whether only the start of the field is shown.
func (f field) Cut() bool { return f.Shown < f.Size }

func viewField(s string, max int, full bool) field {
	f := field{Size: len(s), Shown: len(s)}
	if !full && len(s) > max {
		s = string(trimPartialRune([]byte(s[:max])))
		f.Shown = len(s)
	}
	f.Text = ops.EscapeControls(s, true)
	return f
}

// metaPair is one metadata entry.
type metaPair struct{ Key, Value string }

// viewMetadata lists a JSON object's entries by key, or returns the raw
// text when it is not one or is longer than max (unless full).
func viewMetadata(b []byte, max int, full bool) ([]metaPair, field) {
	if len(b) == 0 {
		return nil, field{}
	}
	var m map[string]any
	if (!full && len(b) > max) || json.Unmarshal(b, &m) != nil {
		return nil, viewField(string(b), max, full)
	}
	out := make([]metaPair, 0, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			j, _ := json.Marshal(v)
			s = string(j)
		}
		out = append(out, metaPair{Key: ops.EscapeControls(k, false), Value: ops.EscapeControls(s, true)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, field{}
}

// payloadView is a payload prepared for display.
type payloadView struct {
	// Kind is "json", "text", "binary" or "empty".
	Kind string
	Text string
	Size int
	// Shown is how many bytes Text covers, less than Size when cut.
	Shown int
}

// Cut reports whether only part of the payload is shown.
func (p payloadView) Cut() bool { return p.Shown < p.Size }

// viewPayload shows JSON indented, other UTF-8 text as it is but for its
// control characters, and anything else as a hex dump, at most max bytes
// of it.
func viewPayload(b []byte, max int) payloadView {
	p := payloadView{Size: len(b), Shown: len(b)}
	if len(b) == 0 {
		p.Kind = "empty"
		return p
	}
	if len(b) <= max && json.Valid(b) {
		var buf bytes.Buffer
		if json.Indent(&buf, b, "", "  ") == nil {
			p.Kind, p.Text = "json", ops.EscapeControls(buf.String(), true)
			return p
		}
	}
	if len(b) > max {
		b = b[:max]
		p.Shown = max
	}
	if utf8.Valid(trimPartialRune(b)) {
		b = trimPartialRune(b)
		p.Kind, p.Text, p.Shown = "text", ops.EscapeControls(string(b), true), len(b)
		return p
	}
	p.Kind, p.Text = "binary", strings.TrimRight(hex.Dump(b), "\n")
	return p
}

// trimPartialRune drops an incomplete UTF-8 sequence a cut left at the end.
func trimPartialRune(b []byte) []byte {
	for i := 1; i < utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			break
		}
	}
	return b
}
