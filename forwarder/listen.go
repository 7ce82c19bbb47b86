package forwarder

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// listenLoop keeps a notification listener running, reconnecting with
// backoff. Each (re)subscription also wakes the forwarder, covering
// notifications sent while it was not listening.
func (f *Forwarder) listenLoop(ctx context.Context, listening chan<- struct{}) {
	delay := 100 * time.Millisecond
	first := true
	for ctx.Err() == nil {
		err := f.listener.Listen(ctx, f.channel, func() {
			if first {
				first = false
				close(listening)
			}
			delay = 100 * time.Millisecond
			f.signal()
		}, f.signal)
		if ctx.Err() != nil {
			return
		}
		f.cfg.Logger.Error("millbox forwarder: notification listener failed; polling meanwhile", err,
			watermill.LogFields{"retry_in": delay.String()})
		sleep(ctx, delay)
		delay = min(2*delay, 5*time.Second)
	}
}
