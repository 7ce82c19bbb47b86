package ops_test

import (
	"testing"

	"github.com/millbox/millbox/sqladapters/ops"
)

func TestEscapeControls(t *testing.T) {
	for _, c := range []struct {
		in              string
		multiline, line string
	}{
		{"plain text, ключ, 😀", "plain text, ключ, 😀", "plain text, ключ, 😀"},
		{"\x1b[2J\x1b]0;PWNED\x07", `\x1b[2J\x1b]0;PWNED\x07`, `\x1b[2J\x1b]0;PWNED\x07`},
		{"a\nb\tc\r\n", "a\nb\tc\\r\n", `a\nb\tc\r\n`},
		{"nul\x00 del\x7f", `nul\x00 del\x7f`, `nul\x00 del\x7f`},
		{"c1 \u009b31m", `c1 \u009b31m`, `c1 \u009b31m`},
		{"bidi \u202egnp.exe", `bidi \u202egnp.exe`, `bidi \u202egnp.exe`},
		{"bad \xff\xfe utf-8", `bad \xff\xfe utf-8`, `bad \xff\xfe utf-8`},
		{"", "", ""},
	} {
		if got := ops.EscapeControls(c.in, true); got != c.multiline {
			t.Errorf("EscapeControls(%q, true) = %q, want %q", c.in, got, c.multiline)
		}
		if got := ops.EscapeControls(c.in, false); got != c.line {
			t.Errorf("EscapeControls(%q, false) = %q, want %q", c.in, got, c.line)
		}
	}
}
