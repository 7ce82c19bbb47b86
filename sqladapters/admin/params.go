package admin

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/millbox/millbox/sqladapters"
)

// Every parameter the page takes is checked here, before any of it
// reaches the database: a request naming another one, giving one twice,
// or giving a value that is not what the parameter takes is answered 400
// Bad Request naming the parameter. Text must be UTF-8 without NUL and
// short; numbers must be numbers in range.

const (
	// maxQueryBytes bounds the query of an address and the body of a
	// form: the page's own links and forms are far shorter.
	maxQueryBytes = 4 << 10
	// maxTextBytes bounds a text filter (topic, key, error).
	maxTextBytes = 1 << 10
)

// params are the validated parameters of one request.
type params struct {
	group      *sqladapters.ErrorFingerprint
	id         int64
	after      int64
	topic, key string
	errText    string
	notice     string
	refresh    time.Duration
	refreshSet bool
	full       bool
	token      string
	confirm    bool
}

// paramError is a parameter the page refuses.
type paramError struct {
	name, problem string
}

func (e *paramError) Error() string {
	return fmt.Sprintf("parameter %s %s", quoteName(e.name), e.problem)
}

// quoteName renders a parameter's name for a message: quoted, escaped
// and short, as it comes from the request.
func quoteName(name string) string {
	if len(name) > 40 {
		name = name[:40] + "…"
	}
	return strconv.QuoteToASCII(name)
}

// parseParams checks the values v (a query or a form) against the names
// a route takes, and returns them parsed.
func parseParams(v url.Values, allowed ...string) (params, error) {
	var p params
	for name, vals := range v {
		known := false
		for _, a := range allowed {
			known = known || a == name
		}
		if !known {
			return p, &paramError{name, "is not one this page takes"}
		}
		if len(vals) != 1 {
			return p, &paramError{name, "is given more than once"}
		}
		if err := p.set(name, vals[0]); err != nil {
			return p, err
		}
	}
	return p, nil
}

func (p *params) set(name, v string) error {
	bad := func(problem string) error { return &paramError{name, problem} }
	switch name {
	case "group":
		fp, err := sqladapters.ParseErrorFingerprint(v)
		if err != nil {
			return bad("must be an error group's fingerprint: 32 hexadecimal digits")
		}
		p.group = &fp
	case "id":
		n, err := parseCount(v)
		if err != nil || n == 0 {
			return bad("must be a message id: a positive whole number")
		}
		p.id = n
	case "after":
		n, err := parseCount(v)
		if err != nil {
			return bad("must be a message id: a whole number")
		}
		p.after = n
	case "topic", "key", "error":
		if err := checkText(v); err != nil {
			return bad(err.Error())
		}
		switch name {
		case "topic":
			p.topic = v
		case "key":
			p.key = v
		default:
			p.errText = v
		}
	case "requeued", "discarded":
		n, err := parseCount(v)
		if err != nil {
			return bad("must be a count")
		}
		a := actionRequeue
		if name == "discarded" {
			a = actionDiscard
		}
		p.notice = fmt.Sprintf("%s %d dead letter%s.", a.past, n, plural(n))
	case "refresh":
		p.refreshSet = true
		if v == "off" {
			return nil
		}
		n, err := parseCount(v)
		d := time.Duration(n) * time.Second
		if err != nil || d < MinRefresh || d > MaxRefresh {
			return bad(fmt.Sprintf("must be off or seconds from %d to %d", int(MinRefresh.Seconds()), int(MaxRefresh.Seconds())))
		}
		p.refresh = d
	case "full":
		if v != "1" {
			return bad("must be 1")
		}
		p.full = true
	case "token":
		if !wellFormedToken(v) {
			return bad("is not a form token of this page")
		}
		p.token = v
	case "confirm":
		if v != "yes" {
			return bad("must be yes")
		}
		p.confirm = true
	default:
		return bad("is not one this page takes")
	}
	return nil
}

// parseCount reads a non-negative int64 written in decimal digits only.
func parseCount(v string) (int64, error) {
	if v == "" || len(v) > 19 || strings.TrimLeft(v, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseInt(v, 10, 64)
}

// checkText accepts a text filter the database can compare: UTF-8,
// without NUL, and short.
func checkText(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("is empty")
	case len(v) > maxTextBytes:
		return fmt.Errorf("is longer than %d bytes", maxTextBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("holds a NUL character")
	}
	return nil
}
