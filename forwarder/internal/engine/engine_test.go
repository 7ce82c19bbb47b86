package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"syscall"
	"testing"

	"github.com/millbox/millbox/forwarder/destination"
	"github.com/millbox/millbox/forwarder/internal/failure"
	"github.com/millbox/millbox/forwarder/internal/source"
	"github.com/millbox/millbox/sqladapters"
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

func TestDestinationUnavailableTellsOutagesFromMessageErrors(t *testing.T) {
	outages := []error{
		destination.ErrDestinationUnavailable,
		fmt.Errorf("publish: %w", syscall.ECONNREFUSED),
		&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("boom")},
		errors.New("kafka: client has run out of available brokers to talk to"),
		errors.New("circuit breaker is open\ncannot produce message 25502664"),
		errors.New("Exception (504) Reason: \"channel/connection is not open\""),
		&destination.PartialError{Delivered: 3, Err: fmt.Errorf("connection lost: %w", destination.ErrDestinationUnavailable)},
	}
	for _, err := range outages {
		if !failure.Unavailable(err) {
			t.Errorf("%v: not seen as the destination being unavailable", err)
		}
	}
	messageErrors := []error{
		errors.New("kafka server: Message was too large"),
		failure.Permanent(errors.New("malformed metadata")),
		fmt.Errorf("%w: the destination did not return within PublishTimeout 1s", errPublishTimeout),
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
	e := &Engine{}
	for _, md := range []string{
		`{}`, ` { } `, `{"a":"b"}`, `{"seq": "0", "partition_key": "key-0"}`,
		"{\n\t\"a\" : \"\" ,\r\n\"b\":\"c\"}", `{"a":"x","a":"y"}`, `{"ü":"ß€𝄞"}`,
		`{"a":"\u0041\n"}`, `{"a":"x","b":"\"q\"","a":"z"}`, "{\"a\":\"\xff\"}",
		`{"a":1}`, `{"a":"x"} junk`, `{"a":"x",}`, `{"a" "x"}`, `{"a":"x"`, `{"a":`, `{`,
		`null`, `[]`, `"a"`, "{\"a\":\"x\ty\"}", `{"a":null}`, `{"a":{"b":"c"}}`,
	} {
		var want map[string]string
		wantErr := json.Unmarshal([]byte(md), &want)
		o := e.prepare(&source.Row{OutboxRow: sqladapters.OutboxRow{UUID: "u", Topic: "t", Metadata: []byte(md)}})
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
