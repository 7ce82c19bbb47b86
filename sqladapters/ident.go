package sqladapters

import (
	"fmt"
	"regexp"
)

// MaxIdentifierLength is the longest schema or table name accepted. It is
// Postgres' limit; MySQL allows 64.
const MaxIdentifierLength = 63

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateIdentifier checks that name is a plain SQL identifier: a letter or
// underscore, then letters, digits or underscores, at most
// MaxIdentifierLength bytes. Names are additionally quoted by the dialects,
// but millbox never accepts a name that would need quoting to be safe.
func ValidateIdentifier(field, name string) error {
	if name == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, field)
	}
	if len(name) > MaxIdentifierLength {
		return fmt.Errorf("%w: %s %q is longer than %d bytes", ErrInvalidName, field, name, MaxIdentifierLength)
	}
	if !identRe.MatchString(name) {
		return fmt.Errorf("%w: %s %q must match %s", ErrInvalidName, field, name, identRe.String())
	}
	return nil
}

// ValidateTableName checks that name is a plain identifier (see
// ValidateIdentifier) of at most max bytes. A dialect's max leaves room for
// the suffixes of the tables it derives from the name.
func ValidateTableName(field, name string, max int) error {
	if err := ValidateIdentifier(field, name); err != nil {
		return err
	}
	if len(name) > max {
		return fmt.Errorf("%w: %s %q is longer than %d bytes", ErrInvalidName, field, name, max)
	}
	return nil
}
