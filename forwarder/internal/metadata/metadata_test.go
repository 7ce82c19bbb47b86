package metadata

import (
	"encoding/json"
	"maps"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Decode gives what encoding/json gives, taking its own decoder for the
// common forms and encoding/json for the rest.
func TestDecodeAsEncodingJSON(t *testing.T) {
	const common = 7 // the first ones take the own decoder
	for i, md := range []string{
		`{}`, ` { } `, `{"a":"b"}`, `{"seq": "0", "partition_key": "key-0"}`,
		"{\n\t\"a\" : \"\" ,\r\n\"b\":\"c\"}", `{"a":"x","a":"y"}`, `{"ü":"ß€𝄞"}`,
		`{"a":"\u0041\n"}`, `{"a":"x","b":"\"q\"","a":"z"}`, "{\"a\":\"\xff\"}",
		`{"a":1}`, `{"a":"x"} junk`, `{"a":"x",}`, `{"a" "x"}`, `{"a":"x"`, `{"a":`, `{`,
		`null`, `[]`, `"a"`, "{\"a\":\"x\ty\"}", `{"a":null}`, `{"a":{"b":"c"}}`,
	} {
		if i < common && !fast([]byte(md), message.Metadata{}) {
			t.Fatalf("%q: left to encoding/json", md)
		}
		var want map[string]string
		wantErr := json.Unmarshal([]byte(md), &want)
		got := message.Metadata{}
		err := Decode([]byte(md), &got)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("%q: error %v, encoding/json says %v", md, err, wantErr)
		}
		if err == nil && !maps.Equal(map[string]string(got), want) {
			t.Fatalf("%q: metadata %v, encoding/json gives %v", md, got, want)
		}
	}
}
