package ops

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// EscapeControls makes text from the database safe to print on a
// terminal or a page: an error, a key or a payload comes from whoever
// published or failed it. It writes C0 and C1 control characters, DEL,
// the Unicode controls that reorder or hide text (bidirectional
// overrides and isolates, zero-width marks, line and paragraph
// separators) and bytes that are not UTF-8 as Go escapes (\x1b, \u202e),
// so that they show instead of acting. Newlines and tabs stay when
// multiline is true, and are escaped as \n and \t otherwise; a backslash
// stays a backslash.
func EscapeControls(s string, multiline bool) string {
	clean := true
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && n == 1) || isControl(r, multiline) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n' && !multiline:
			b.WriteString(`\n`)
		case r == '\t' && !multiline:
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case isControl(r, multiline) && r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		case isControl(r, multiline):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// isControl reports whether r acts on a terminal or reorders text rather
// than shows.
func isControl(r rune, multiline bool) bool {
	switch {
	case r == '\n' || r == '\t':
		return !multiline
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r == 0x061c, r >= 0x200b && r <= 0x200f, r >= 0x2028 && r <= 0x202e, r >= 0x2066 && r <= 0x2069, r == 0xfeff:
		return true
	}
	return false
}
