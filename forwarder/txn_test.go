package forwarder

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestProgressRoundTrip(t *testing.T) {
	published := map[int64]uint32{7: 0, 1 << 40: 12, 3: 4294967295}
	b := encodeProgress(published, []progressRow{{id: 9}, {id: 7}, {id: 5, xid: 100}})
	got, err := decodeProgress(b)
	if err != nil {
		t.Fatal(err)
	}
	want := []progressRow{{3, 4294967295}, {5, 100}, {7, 0}, {9, 0}, {1 << 40, 12}}
	if !slices.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	if rows, err := decodeProgress(nil); err != nil || rows != nil {
		t.Fatalf("no progress: %v, %v", rows, err)
	}
	if rows, err := decodeProgress(encodeProgress(nil, nil)); err != nil || len(rows) != 0 {
		t.Fatalf("empty progress: %v, %v", rows, err)
	}
	for name, bad := range map[string][]byte{
		"foreign":   []byte("{\"offset\":3}"),
		"truncated": b[:len(b)-1],
		"trailing":  append(slices.Clone(b), 0),
		"count":     append(slices.Clone(progressMagic), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := decodeProgress(bad); !errors.Is(err, errBadProgress) {
			t.Errorf("%s: %v, want errBadProgress", name, err)
		}
	}
}

func TestExactlyOnceNeedsATransactionalDestination(t *testing.T) {
	pub := gochannel.NewGoChannel(gochannel.Config{}, nil)
	defer pub.Close()
	cfg := Config{DB: stdsql.WrapDB(nil), Dialect: postgres.MustNew(postgres.Options{}), Destination: pub, ExactlyOnce: true}
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "ExactlyOnce") || !strings.Contains(err.Error(), "*gochannel.GoChannel") {
		t.Fatalf("ExactlyOnce with a plain publisher: %v", err)
	}
	if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New: %v", err)
	}
	cfg.ExactlyOnce = false
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the same without ExactlyOnce: %v", err)
	}
}

func TestTxAbortedErrorFindsUnavailable(t *testing.T) {
	err := error(&TxAbortedError{Failed: map[int]error{2: errors.New("too large"), 0: DestinationUnavailable(errors.New("broker gone"))}})
	if !errors.Is(err, ErrDestinationUnavailable) {
		t.Fatalf("%v does not wrap ErrDestinationUnavailable", err)
	}
	if s := err.Error(); !strings.Contains(s, "batch 0: broker gone; batch 2: too large") {
		t.Fatalf("message %q", s)
	}
	if errors.Is(&TxAbortedError{Failed: map[int]error{1: errors.New("too large")}}, ErrDestinationUnavailable) {
		t.Fatal("a message failure reads as the destination being unavailable")
	}
}
