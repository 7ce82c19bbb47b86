package testenv

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// KgoProducerOptions returns franz-go client options tuned for tests
// against a local broker, as KafkaSaramaConfig does for sarama: a short
// dial timeout, metadata refreshed every 250 ms at most, and retries every
// 100 ms, so that a client finds a restarted broker quickly.
func KgoProducerOptions() []kgo.Opt {
	return []kgo.Opt{
		kgo.ClientID("millbox-test"),
		kgo.DialTimeout(5 * time.Second),
		kgo.MetadataMinAge(250 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 100 * time.Millisecond }),
	}
}
