package metadata

import (
	"encoding/json"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Decode decodes the stored metadata b into *md, as encoding/json does:
// entries are added to the map, JSON null leaves a nil map, anything but
// an object of strings is an error. Empty b is no metadata.
func Decode(b []byte, md *message.Metadata) error {
	if len(b) == 0 || (*md != nil && fast(b, *md)) {
		return nil
	}
	return json.Unmarshal(b, md)
}

// fast decodes the common form of stored metadata, a flat JSON
// object of strings without escapes, into md, and reports whether it did.
// Anything else is left to encoding/json, which then decodes the whole
// object again, setting the entries set here to the same values, or
// reports it malformed. This makes one allocation where encoding/json
// makes several per entry, and metadata is decoded for every message.
func fast(b []byte, md message.Metadata) bool {
	s := string(b) // keys and values share this one copy
	i := skipSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return false
	}
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return skipSpace(s, i+1) == len(s)
	}
	for {
		k, next, ok := plainString(s, i)
		if !ok {
			return false
		}
		i = skipSpace(s, next)
		if i == len(s) || s[i] != ':' {
			return false
		}
		v, next, ok := plainString(s, skipSpace(s, i+1))
		if !ok {
			return false
		}
		md[k] = v
		i = skipSpace(s, next)
		switch {
		case i == len(s):
			return false
		case s[i] == '}':
			return skipSpace(s, i+1) == len(s)
		case s[i] != ',':
			return false
		}
		i = skipSpace(s, i+1)
	}
}

// plainString returns the JSON string starting at s[i] when it has no
// escapes, control characters or invalid UTF-8, and the index after it.
func plainString(s string, i int) (str string, next int, ok bool) {
	if i >= len(s) || s[i] != '"' {
		return "", 0, false
	}
	ascii := true
	for j := i + 1; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			str = s[i+1 : j]
			if !ascii && !utf8.ValidString(str) {
				return "", 0, false
			}
			return str, j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", 0, false
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}
