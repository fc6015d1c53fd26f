package gaps

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParseDropMarker feeds the drop-marker parser the markers of testdata/markers plus mutations: it
// must never panic, must wrap ErrBadMarker on failure, and what it accepts must be self-consistent
// and survive a round trip.
func FuzzParseDropMarker(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "markers", "*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("seed corpus: %v (%d files)", err, len(files))
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"type":"drop_marker","key":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseDropMarker(data)
		if err != nil {
			if !errors.Is(err, ErrBadMarker) {
				t.Fatalf("error %v does not wrap ErrBadMarker", err)
			}
			return
		}
		if m.Type != DropMarkerEvent || m.FirstSeq > m.LastSeq || m.Count != m.LastSeq-m.FirstSeq+1 || m.Count == 0 || m.Reason == "" || m.Key.DPRank < 0 {
			t.Fatalf("accepted an inconsistent marker %+v", m)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseDropMarker(again)
		if err != nil || m2 != m {
			t.Fatalf("round trip: %+v, %v; want %+v", m2, err, m)
		}
	})
}

func TestParseDropMarkerErrorsNameTheField(t *testing.T) {
	tests := map[string]struct {
		body string
		want string
	}{
		"wrong type":       {`{"type":"gap"}`, `type "gap", want "drop_marker"`},
		"no key":           {`{"type":"drop_marker"}`, "missing key"},
		"partial key":      {`{"type":"drop_marker","key":{"namespace":"a"}}`, "key needs namespace, component, worker_id and dp_rank"},
		"inverted range":   {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":10,"last_seq":5,"reason":"x"}`, "first_seq 10 > last_seq 5"},
		"count mismatch":   {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":1,"last_seq":5,"count":4,"reason":"x"}`, "count 4 does not match"},
		"no reason":        {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":1,"last_seq":5}`, "missing reason"},
		"negative rank":    {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":-1},"epoch":1,"first_seq":1,"last_seq":5,"reason":"x"}`, "dp_rank -1 out of range"},
		"not json":         {`{"type":`, "unexpected end"},
		"string for a seq": {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":"1","last_seq":5,"reason":"x"}`, "cannot unmarshal"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseDropMarker([]byte(tc.body))
			check(t, errors.Is(err, ErrBadMarker), "error %v does not wrap ErrBadMarker", err)
			check(t, contains(err.Error(), tc.want), "error %q does not say %q", err, tc.want)
		})
	}
	m, err := ParseDropMarker([]byte(`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"w","dp_rank":2},"epoch":9,"first_seq":3,"last_seq":5,"reason":"buffer_full","bridge":"x","first_received_at_ms":1,"last_received_at_ms":2}`))
	check(t, err == nil, "valid marker: %v", err)
	equal(t, DropMarker{Type: DropMarkerEvent, Key: KeyJSON{"a", "b", "w", 2}, Epoch: 9, FirstSeq: 3, LastSeq: 5, Count: 3,
		Reason: "buffer_full", Bridge: "x", FirstReceivedAtMs: 1, LastReceivedAtMs: 2}, m)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
