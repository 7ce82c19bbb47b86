package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
)

// maxIncidents bounds the causes remembered; past it they are forgotten
// all at once, and each is logged again the next time it happens.
const maxIncidents = 256

// incidents gives every cause of a server error a reference id, which the
// error page shows instead of the detail, and logs the detail with it the
// first time the cause happens: a failure that every request meets (the
// database is down, a scan times out) is logged once, not per request.
type incidents struct {
	logger *slog.Logger

	mu   sync.Mutex // guards refs
	refs map[[sha256.Size]byte]string
}

func newIncidents(logger *slog.Logger) *incidents {
	return &incidents{logger: logger, refs: map[[sha256.Size]byte]string{}}
}

// report returns the reference id of err's cause, logging the detail
// when the cause is new.
func (in *incidents) report(path string, err error) string {
	cause := sha256.Sum256([]byte(err.Error()))
	in.mu.Lock()
	ref, seen := in.refs[cause]
	if !seen {
		if len(in.refs) >= maxIncidents {
			clear(in.refs)
		}
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		ref = hex.EncodeToString(b)
		in.refs[cause] = ref
	}
	in.mu.Unlock()
	if !seen {
		in.logger.Error("millbox admin: a request failed; later requests failing the same way refer to this entry",
			"ref", ref, "path", path, "error", err)
	}
	return ref
}
