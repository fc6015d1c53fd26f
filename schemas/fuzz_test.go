package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeFPM feeds arbitrary bytes to DecodeFPM. It must never panic; every error must be a
// *decodeError or *validationError; and a payload that decodes must round-trip: its JSON parses back
// (ParseFPMJSON) to the same typed fields, re-canonicalizes to the same bytes, and EncodeMsgpack of the
// typed fields decodes to the same typed fields. Seeds: testdata/fuzz/FuzzDecodeFPM plus the payloads
// the unit tests build.
func FuzzDecodeFPM(f *testing.F) {
	for _, p := range [][]byte{goldenPayload(), heartbeatPayload(), unknownFieldsPayload(), mpDepthBomb(40)} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		fpm, err := DecodeFPM(payload)
		if err != nil {
			var de *decodeError
			var ve *validationError
			switch {
			case errors.As(err, &de):
				if !errors.Is(err, errMalformed) || de.Offset < 0 || de.Offset > len(payload) {
					t.Fatalf("bad DecodeError %+v", de)
				}
			case errors.As(err, &ve):
				if !errors.Is(err, ErrInvalid) || ve.Reason == "" {
					t.Fatalf("bad ValidationError %+v", ve)
				}
			default:
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			return
		}
		if err := fpm.Validate(); err != nil {
			t.Fatalf("decoded FPM fails Validate: %v", err)
		}
		if !json.Valid(fpm.JSON) {
			t.Fatalf("canonical JSON is not valid JSON: %q", fpm.JSON)
		}
		back, err := ParseFPMJSON(fpm.JSON)
		if err != nil {
			t.Fatalf("ParseFPMJSON(canonical JSON): %v\n%s", err, fpm.JSON)
		}
		if typedFields(back) != typedFields(fpm) {
			t.Fatalf("JSON round trip changed typed fields\n got %+v\nwant %+v", typedFields(back), typedFields(fpm))
		}
		// The canonical JSON is a fixed point: read as JSON and written again, it is unchanged.
		d := getDecoder(fpm.JSON)
		if err := d.parseJSON(); err != nil {
			t.Fatalf("parseJSON: %v", err)
		}
		again, _ := appendCanonical(nil, &d.tree, 0)
		putDecoder(d)
		if !bytes.Equal(again, fpm.JSON) {
			t.Fatalf("canonical JSON is not stable\n got %s\nwant %s", again, fpm.JSON)
		}
		enc, err := DecodeFPM(EncodeMsgpack(fpm))
		if err != nil {
			t.Fatalf("DecodeFPM(EncodeMsgpack): %v", err)
		}
		if typedFields(enc) != typedFields(fpm) {
			t.Fatalf("msgpack round trip changed typed fields\n got %+v\nwant %+v", typedFields(enc), typedFields(fpm))
		}
	})
}

// FuzzParseTraceLine feeds arbitrary bytes to ParseTraceLine. It must never panic; every error must be a
// *traceLineError; and an accepted line must be written back by AppendTraceLine as a line that parses to
// the same value, with an fpm object ParseFPMJSON accepts.
func FuzzParseTraceLine(f *testing.F) {
	for _, l := range traceLines(f) {
		f.Add(AppendTraceLine(nil, &l))
	}
	f.Add([]byte(seedLineJSON + "\n"))
	f.Add([]byte(`{"timestamp":1,"event":{"schema":"dynamo.fpm.trace.v1","source":{"namespace":"n","component":"c","producer_id":"p"},"capture_mode":"full","observed_at_unix_ms":2,"fpm":{}}}`))
	f.Add([]byte(`{"timestamp":1,"event":[]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		l, err := ParseTraceLine(line)
		if err != nil {
			var te *traceLineError
			if !errors.As(err, &te) || !errors.Is(err, ErrInvalidTraceLine) || te.Reason == "" {
				t.Fatalf("bad error %T: %v", err, err)
			}
			return
		}
		if _, err := ParseFPMJSON(l.Event.FPM); err != nil {
			t.Fatalf("accepted line's fpm fails ParseFPMJSON: %v", err)
		}
		out := AppendTraceLine(nil, l)
		if !json.Valid(out) {
			t.Fatalf("AppendTraceLine wrote invalid JSON: %q", out)
		}
		back, err := ParseTraceLine(out)
		if err != nil {
			t.Fatalf("ParseTraceLine(AppendTraceLine(l)): %v\n%s", err, out)
		}
		if back.Timestamp != l.Timestamp || back.Event.Schema != l.Event.Schema || back.Event.Source != l.Event.Source ||
			back.Event.CaptureMode != l.Event.CaptureMode || back.Event.ObservedAtUnixMs != l.Event.ObservedAtUnixMs ||
			!bytes.Equal(back.Event.FPM, l.Event.FPM) {
			t.Fatalf("round trip changed the line\n got %+v\nwant %+v", back, l)
		}
	})
}
