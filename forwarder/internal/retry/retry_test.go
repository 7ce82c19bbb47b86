package retry

import (
	"testing"
	"time"
)

func TestExponentialGrowsAndIsCapped(t *testing.T) {
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := (Exponential{Min: 100 * time.Millisecond, Max: time.Second}).NextRetry(i+1, nil); got != w*time.Millisecond {
			t.Fatalf("attempt %d: backoff %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
	for range 1000 {
		if d := (Exponential{Min: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}).NextRetry(1, nil); d < 50*time.Millisecond || d > 150*time.Millisecond {
			t.Fatalf("jittered backoff %v outside ±50%%", d)
		}
	}
}

func TestBackoffCountsAttempts(t *testing.T) {
	b := Backoff{Policy: Exponential{Min: time.Millisecond, Max: 4 * time.Millisecond}}
	for _, want := range []time.Duration{1, 2, 4, 4} {
		if got := b.Next(nil); got != want*time.Millisecond {
			t.Fatalf("wait %v, want %v", got, want*time.Millisecond)
		}
	}
	b.Reset()
	if b.Failing() || b.Next(nil) != time.Millisecond {
		t.Fatal("Reset did not start again")
	}
}
