package main

import (
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"
)

// duplicatingPublisher publishes every tenth event named name twice, as a
// producer that lost an ack and retried would.
type duplicatingPublisher struct {
	message.Publisher
	name      string
	seen      atomic.Int64
	sentTwice atomic.Int64
}

func (p *duplicatingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		if m.Metadata.Get("name") == p.name && p.seen.Add(1)%10 == 1 {
			if err := p.Publisher.Publish(topic, m.Copy()); err != nil {
				return err
			}
			p.sentTwice.Add(1)
		}
	}
	return nil
}
