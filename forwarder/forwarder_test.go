package forwarder

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/postgres"
	"github.com/millbox/millbox/sqladapters/stdsql"
)

func TestConfigDefaultsAndValidation(t *testing.T) {
	var c Config
	c.setDefaults()
	if c.BatchSize != DefaultBatchSize || c.Concurrency != DefaultConcurrency || c.MaxAttempts != DefaultMaxAttempts ||
		c.Logger == nil || c.Source != (Polling{}) {
		t.Fatalf("defaults not applied: %+v", c)
	}
	var p Polling
	p.setDefaults()
	if p.Partitions != DefaultPartitions || p.LeaseTTL != DefaultLeaseTTL || p.InstanceID == "" {
		t.Fatalf("polling defaults not applied: %+v", p)
	}
	if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.DB") {
		t.Fatalf("missing DB: %v", err)
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

func TestDestinationUnavailableTellsOutagesFromMessageErrors(t *testing.T) {
	outages := []error{
		ErrDestinationUnavailable,
		fmt.Errorf("publish: %w", syscall.ECONNREFUSED),
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("boom")},
		errors.New("kafka: client has run out of available brokers to talk to"),
		errors.New("circuit breaker is open\ncannot produce message 25502664"),
		errors.New("Exception (504) Reason: \"channel/connection is not open\""),
		&PartialError{Delivered: 3, Err: fmt.Errorf("connection lost: %w", ErrDestinationUnavailable)},
	}
	for _, err := range outages {
		if !failure.Unavailable(err) {
			t.Errorf("%v: not seen as the destination being unavailable", err)
		}
	}
	messageErrors := []error{
		errors.New("kafka server: Message was too large"),
		failure.Permanent(errors.New("malformed metadata")),
		fmt.Errorf("%w: Publish did not return within PublishTimeout 1s", errPublishTimeout),
	}
	for _, err := range messageErrors {
		if failure.Unavailable(err) {
			t.Errorf("%v: seen as an outage, but it is about the message", err)
		}
	}
}

// prepare decodes metadata as encoding/json does (forwarder/internal/metadata
// checks which forms take its own decoder).
func TestPrepareDecodesMetadataAsEncodingJSON(t *testing.T) {
	f := &Forwarder{}
	for _, md := range []string{
		`{}`, ` { } `, `{"a":"b"}`, `{"seq": "0", "partition_key": "key-0"}`,
		"{\n\t\"a\" : \"\" ,\r\n\"b\":\"c\"}", `{"a":"x","a":"y"}`, `{"ü":"ß€𝄞"}`,
		`{"a":"\u0041\n"}`, `{"a":"x","b":"\"q\"","a":"z"}`, "{\"a\":\"\xff\"}",
		`{"a":1}`, `{"a":"x"} junk`, `{"a":"x",}`, `{"a" "x"}`, `{"a":"x"`, `{"a":`, `{`,
		`null`, `[]`, `"a"`, "{\"a\":\"x\ty\"}", `{"a":null}`, `{"a":{"b":"c"}}`,
	} {
		var want map[string]string
		wantErr := json.Unmarshal([]byte(md), &want)
		o := f.prepare(sqladapters.OutboxRow{UUID: "u", Topic: "t", Metadata: []byte(md)})
		if (o.err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json says %v", md, o.err, wantErr)
		}
		if wantErr != nil {
			if !failure.IsPermanent(o.err) {
				t.Fatalf("%q: error %v is not permanent", md, o.err)
			}
			continue
		}
		if got := map[string]string(o.msg.Metadata); !maps.Equal(got, want) {
			t.Fatalf("%q: metadata %v, encoding/json gives %v", md, got, want)
		}
	}
}

// Validate accepts what New accepts: zero fields take their defaults.
func TestValidateAppliesDefaults(t *testing.T) {
	cfg := Config{
		DB:          stdsql.WrapDB(nil),
		Dialect:     postgres.MustNew(postgres.Options{}),
		Destination: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}),
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate of a config New accepts: %v", err)
	}
	cfg.BatchSize = -1
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "BatchSize") {
		t.Fatalf("Validate with BatchSize -1: %v", err)
	}
	cfg.BatchSize = 0
	cfg.Source = Polling{Partitions: -1}
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Polling.Partitions") {
		t.Fatalf("Validate with Polling.Partitions -1: %v", err)
	}
}
