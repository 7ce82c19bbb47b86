package retry

import (
	"math/rand/v2"
	"time"
)

// Policy returns the delay before attempt+1, after attempt (1 for the
// first) failed with err. It must be safe for concurrent use.
type Policy interface {
	NextRetry(attempt int, err error) time.Duration
}

// Exponential waits Min after the first failure, doubling with each
// further one up to Max, each delay randomized by ± Jitter (a fraction,
// 0 for none).
type Exponential struct {
	Min, Max time.Duration
	Jitter   float64
}

// NextRetry implements Policy.
func (p Exponential) NextRetry(attempt int, _ error) time.Duration {
	d := p.Min
	for i := 1; i < attempt && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	if p.Jitter > 0 && d > 0 {
		d = time.Duration(float64(d) * (1 + p.Jitter*(2*rand.Float64()-1)))
	}
	return d
}

// The forwarder's own retries, each a Policy.
var (
	// Operations paces a database or destination operation the forwarder
	// retries on its own: a read of the outbox, a delete of published
	// rows, a look at the high-water mark, a move of due messages, a
	// claim of a partition at the destination. It waits a second at most,
	// so that a database back after a failover (a standby promoted) is
	// found within about a second; a failing attempt costs the server
	// little more than a refused connection.
	Operations = Exponential{Min: 100 * time.Millisecond, Max: time.Second}
	// Probes paces the probes of a destination that is down: the first
	// follows at once, then the delay doubles up to a second, so a
	// destination that comes back is noticed within about a second.
	Probes = Exponential{Min: 50 * time.Millisecond, Max: time.Second}
)

// Backoff counts the attempts of one operation and asks a Policy for each
// wait. Its zero value is not usable: set Policy.
type Backoff struct {
	Policy  Policy
	attempt int
}

// Next returns the wait after one more failure.
func (b *Backoff) Next(err error) time.Duration {
	b.attempt++
	return b.Policy.NextRetry(b.attempt, err)
}

// Reset starts counting again after a success.
func (b *Backoff) Reset() { b.attempt = 0 }

// Failing tells whether a failure was counted since the last Reset.
func (b *Backoff) Failing() bool { return b.attempt > 0 }
