package failure

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := Backoff(i+1, 100*time.Millisecond, time.Second, 0); got != w*time.Millisecond {
			t.Fatalf("attempt %d: backoff %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	for range 1000 {
		if d := Backoff(1, 100*time.Millisecond, time.Second, 0.5); d < 50*time.Millisecond || d > 150*time.Millisecond {
			t.Fatalf("jittered backoff %v outside ±50%%", d)
		}
	}
}

func TestTextIsStorable(t *testing.T) {
	s := Text(errors.New("bad \xff\xfe bytes \x00 and " + strings.Repeat("é", 3000)))
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) || len(s) > MaxErrorLength {
		t.Fatalf("not storable: valid=%v len=%d", utf8.ValidString(s), len(s))
	}
}

func TestPermanentIsNeverAnOutage(t *testing.T) {
	err := Permanent(errors.New("connection refused in the payload"))
	if !IsPermanent(err) || Unavailable(err) {
		t.Fatalf("permanent %v, unavailable %v", IsPermanent(err), Unavailable(err))
	}
}
