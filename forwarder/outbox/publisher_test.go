package outbox

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/millbox/millbox/sqladapters/postgres"
)

func TestKeyHashOfEmptyKeyIsFixed(t *testing.T) {
	// FNV-1a of no bytes, in 31 bits.
	if got := KeyHash(""); got != 18652613 {
		t.Fatalf("KeyHash(\"\") = %d, want 18652613", got)
	}
}

// Messages without a key spread over the partitions by their UUID, the
// same way on every instance.
func TestKeylessMessagesSpreadByUUID(t *testing.T) {
	p, err := NewContextPublisher(PublisherConfig{Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for _, id := range []string{"a", "b", "c", "d"} {
		row, err := p.toRow("t", 0, message.NewMessage(id, nil), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if row.KeyHash != KeyHash(id) {
			t.Fatalf("message %s without key: hash %d, want KeyHash of its UUID %d", id, row.KeyHash, KeyHash(id))
		}
		seen[row.KeyHash] = true
	}
	if len(seen) < 2 {
		t.Fatal("messages without a key all landed on one hash")
	}
}

func TestPublishTxNeedsATransaction(t *testing.T) {
	p, err := NewContextPublisher(PublisherConfig{Dialect: postgres.MustNew(postgres.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.PublishTx(t.Context(), nil, "t", message.NewMessage("a", nil)); !errors.Is(err, ErrNoTx) {
		t.Fatalf("PublishTx without a transaction: %v, want ErrNoTx", err)
	}
}

func TestKeyHashIsStableAndNonNegative(t *testing.T) {
	// Every instance, of any version, must place a key in the same
	// partition: the hash is FNV-1a in 31 bits, pinned here.
	for key, want := range map[string]int32{"customer-1": 307212823, "order-42": 1461995252} {
		if got := KeyHash(key); got != want {
			t.Fatalf("KeyHash(%q) = %d, want %d", key, got, want)
		}
	}
	for _, k := range []string{"", "a", "customer-42", strings.Repeat("x", 1000)} {
		if KeyHash(k) < 0 {
			t.Fatalf("negative hash for %q", k)
		}
	}
}
