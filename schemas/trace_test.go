package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func mustDecodeFPM(t testing.TB, payload []byte) *FPM {
	t.Helper()
	f, err := DecodeFPM(payload)
	if err != nil {
		t.Fatalf("DecodeFPM: %v", err)
	}
	return f
}

// seedLine is the record of the "Record Schema" example in Dynamo's trace reference.
func seedLine(t testing.TB) TraceLine {
	return TraceLine{
		Timestamp: 1250,
		Event: TraceEvent{
			Schema:           TraceSchema,
			Source:           TraceSource{Namespace: "default", Component: "backend", ProducerID: "4192"},
			CaptureMode:      CaptureSampled,
			ObservedAtUnixMs: 1782777601250,
			FPM:              mustDecodeFPM(t, goldenPayload()).JSON,
		},
	}
}

func traceLines(t testing.TB) map[string]TraceLine {
	full := seedLine(t)
	full.Event.CaptureMode = CaptureFull
	full.Timestamp = 0
	full.Event.FPM = mustDecodeFPM(t, heartbeatPayload()).JSON
	escapes := seedLine(t)
	escapes.Event.Source = TraceSource{Namespace: `ns<&>"q"`, Component: "comp\\\n\t\x01", ProducerID: "worker/a:b é"}
	unknown := seedLine(t)
	unknown.Event.FPM = mustDecodeFPM(t, unknownFieldsPayload()).JSON
	return map[string]TraceLine{
		"seed example":            seedLine(t),
		"full mode heartbeat":     full,
		"source needs escaping":   escapes,
		"fpm with unknown fields": unknown,
	}
}

const seedLineJSON = `{"timestamp":1250,"event":{"schema":"dynamo.fpm.trace.v1","source":{"namespace":"default",` +
	`"component":"backend","producer_id":"4192"},"capture_mode":"sampled","observed_at_unix_ms":1782777601250,` +
	`"fpm":` + goldenJSON + `}}`

func TestAppendTraceLine(t *testing.T) {
	l := seedLine(t)
	if got := string(AppendTraceLine([]byte("prefix:"), &l)); got != "prefix:"+seedLineJSON {
		t.Errorf("AppendTraceLine\n got %s\nwant prefix:%s", got, seedLineJSON)
	}
}

// AppendTraceLine writes what encoding/json writes for the same struct with HTML escaping off (their
// only difference, U+2028/U+2029, is left out of these lines).
func TestAppendTraceLineMatchesEncodingJSON(t *testing.T) {
	for name, l := range traceLines(t) {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(&l); err != nil {
				t.Fatal(err)
			}
			want := strings.TrimSuffix(buf.String(), "\n")
			if got := string(AppendTraceLine(nil, &l)); got != want {
				t.Errorf("AppendTraceLine\n got %s\nwant %s", got, want)
			}
		})
	}
}

func TestAppendTraceLineEmptyFPMIsNull(t *testing.T) {
	l := seedLine(t)
	l.Event.FPM = nil
	got := AppendTraceLine(nil, &l)
	if !bytes.HasSuffix(got, []byte(`"fpm":null}}`)) || !json.Valid(got) {
		t.Errorf("got %s", got)
	}
}

func TestParseTraceLineRoundTrip(t *testing.T) {
	for name, l := range traceLines(t) {
		t.Run(name, func(t *testing.T) {
			line := AppendTraceLine(nil, &l)
			got, err := ParseTraceLine(append(line, '\n'))
			if err != nil {
				t.Fatalf("ParseTraceLine: %v", err)
			}
			if !reflect.DeepEqual(*got, l) {
				t.Errorf("round trip\n got %+v\nwant %+v", *got, l)
			}
			// The result does not alias the input.
			for i := range line {
				line[i] = ' '
			}
			if !reflect.DeepEqual(*got, l) {
				t.Errorf("parsed line changed when the input was overwritten")
			}
			if _, err := ParseFPMJSON(got.Event.FPM); err != nil {
				t.Errorf("ParseFPMJSON(fpm): %v", err)
			}
		})
	}
}

func TestParseTraceLineErrors(t *testing.T) {
	sub := func(old, new string) []byte {
		if !strings.Contains(seedLineJSON, old) {
			t.Fatalf("seed line has no %s", old)
		}
		return []byte(strings.Replace(seedLineJSON, old, new, 1))
	}
	tests := map[string]struct {
		line  []byte
		field string
		also  error // errMalformed, ErrInvalid, or nil
	}{
		"not JSON":                  {[]byte("timestamp=1"), "", errMalformed},
		"empty line":                {[]byte("\n"), "", errMalformed},
		"array":                     {[]byte(`[` + seedLineJSON + `]`), "", errMalformed},
		"truncated":                 {[]byte(seedLineJSON[:100]), "event.source", errMalformed},
		"two objects":               {[]byte(seedLineJSON + seedLineJSON), "", errMalformed},
		"duplicate key":             {sub(`"timestamp":1250,`, `"timestamp":1250,"timestamp":1,`), "timestamp", errMalformed},
		"wrong schema":              {sub(`"dynamo.fpm.trace.v1"`, `"dynamo.fpm.trace.v2"`), "event.schema", nil},
		"schema not a string":       {sub(`"dynamo.fpm.trace.v1"`, `1`), "event.schema", nil},
		"unknown capture mode":      {sub(`"sampled"`, `"Sampled"`), "event.capture_mode", nil},
		"missing event":             {[]byte(`{"timestamp":1}`), "event", nil},
		"missing timestamp":         {sub(`"timestamp":1250,`, ``), "timestamp", nil},
		"missing producer_id":       {sub(`,"producer_id":"4192"`, ``), "event.source.producer_id", nil},
		"missing fpm":               {sub(`,"fpm":`+goldenJSON, ``), "event.fpm", nil},
		"unknown envelope field":    {sub(`"capture_mode"`, `"extra":1,"capture_mode"`), "event.extra", nil},
		"unknown top-level field":   {sub(`{"timestamp"`, `{"host":"x","timestamp"`), "host", nil},
		"negative timestamp":        {sub(`"timestamp":1250`, `"timestamp":-1`), "timestamp", nil},
		"float timestamp":           {sub(`"timestamp":1250`, `"timestamp":1250.0`), "timestamp", nil},
		"observed_at is a string":   {sub(`1782777601250`, `"1782777601250"`), "event.observed_at_unix_ms", nil},
		"observed_at out of range":  {sub(`1782777601250`, `99999999999999999999`), "event.observed_at_unix_ms", nil},
		"source is an array":        {sub(`{"namespace":"default","component":"backend","producer_id":"4192"}`, `[]`), "event.source", nil},
		"fpm is an array":           {sub(`"fpm":`+goldenJSON, `"fpm":[]`), "event.fpm", nil},
		"fpm is null":               {sub(`"fpm":`+goldenJSON, `"fpm":null`), "event.fpm", nil},
		"fpm version 2":             {sub(`"version":1`, `"version":2`), "event.fpm.version", ErrInvalid},
		"fpm negative count":        {sub(`"num_decode_requests":3`, `"num_decode_requests":-3`), "event.fpm.scheduled_requests.num_decode_requests", ErrInvalid},
		"fpm missing nested field":  {sub(`"num_decode_requests":0,`, ``), "event.fpm.queued_requests.num_decode_requests", ErrInvalid},
		"fpm worker_id is a number": {sub(`"worker_id":"4192"`, `"worker_id":4192`), "event.fpm.worker_id", ErrInvalid},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := ParseTraceLine(tc.line)
			if err == nil {
				t.Fatalf("ParseTraceLine succeeded: %+v", l)
			}
			if !errors.Is(err, ErrInvalidTraceLine) {
				t.Fatalf("error %v does not match ErrInvalidTraceLine", err)
			}
			var te *traceLineError
			if !errors.As(err, &te) {
				t.Fatalf("error %T is not a *TraceLineError", err)
			}
			if te.Field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", te.Field, tc.field, err)
			}
			if te.Reason == "" {
				t.Errorf("empty Reason")
			}
			for _, sentinel := range []error{errMalformed, ErrInvalid} {
				if got, want := errors.Is(err, sentinel), sentinel == tc.also; got != want {
					t.Errorf("errors.Is(err, %v) = %v, want %v (%v)", sentinel, got, want, err)
				}
			}
		})
	}
}

func BenchmarkAppendTraceLine(b *testing.B) {
	l := seedLine(b)
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendTraceLine(buf[:0], &l)
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkParseTraceLine(b *testing.B) {
	l := seedLine(b)
	line := AppendTraceLine(nil, &l)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseTraceLine(line); err != nil {
			b.Fatal(err)
		}
	}
}
