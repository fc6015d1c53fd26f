package streams

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// FuzzParseDropMarker feeds the drop-marker parser the markers of testdata/markers plus mutations: it
// must never panic, must wrap errBadDropMarker on failure, and what it accepts must be self-consistent
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
			if !errors.Is(err, errBadDropMarker) {
				t.Fatalf("error %v does not wrap ErrBadDropMarker", err)
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
		"wrong type":        {`{"type":"gap"}`, `type "gap", want "drop_marker"`},
		"no key":            {`{"type":"drop_marker"}`, "missing key"},
		"partial key":       {`{"type":"drop_marker","key":{"namespace":"a"}}`, "key needs namespace, component, worker_id and dp_rank"},
		"inverted range":    {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":10,"last_seq":5,"reason":"x"}`, "first_seq 10 > last_seq 5"},
		"count mismatch":    {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":1,"last_seq":5,"count":4,"reason":"x"}`, "count 4 does not match"},
		"no reason":         {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":1,"last_seq":5}`, "missing reason"},
		"negative rank":     {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":-1},"epoch":1,"first_seq":1,"last_seq":5,"reason":"x"}`, "dp_rank -1 out of range"},
		"not json":          {`{"type":`, "unexpected end"},
		"unknown run start": {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":1,"last_seq":5,"reason":"x","run_start":"reboot"}`, `run_start "reboot"`},
		"string for a seq":  {`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"","dp_rank":0},"epoch":1,"first_seq":"1","last_seq":5,"reason":"x"}`, "cannot unmarshal"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParseDropMarker([]byte(tc.body))
			if !errors.Is(err, errBadDropMarker) {
				t.Fatalf("error %v does not wrap ErrBadDropMarker", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
	m, err := ParseDropMarker([]byte(`{"type":"drop_marker","key":{"namespace":"a","component":"b","worker_id":"w","dp_rank":2},"epoch":9,"first_seq":3,"last_seq":5,"reason":"buffer_full","bridge":"x","first_received_at_ms":1,"last_received_at_ms":2,"run_start":"restart"}`))
	if err != nil {
		t.Fatalf("valid marker: %v", err)
	}
	want := DropMarker{Type: DropMarkerEvent, Key: Key{Namespace: "a", Component: "b", WorkerID: "w", DPRank: 2}, Epoch: 9, FirstSeq: 3, LastSeq: 5, Count: 3,
		Reason: "buffer_full", Bridge: "x", FirstReceivedAtMs: 1, LastReceivedAtMs: 2, RunStart: RunStartRestart}
	if !reflect.DeepEqual(want, m) {
		t.Fatalf("want %+v\n got %+v", want, m)
	}
}

// The bridge's marker message is what the gap detector's parser reads back: subject, id derived from
// the range, event and bridge headers, and a body ParseDropMarker returns unchanged.
func TestDropMarkerMsgRoundTrip(t *testing.T) {
	m := DropMarker{Type: DropMarkerEvent, Key: Key{Namespace: "dynamo", Component: "backend", WorkerID: "w.1", DPRank: 3},
		Epoch: 1700000000000, FirstSeq: 10, LastSeq: 14, Count: 5, Reason: "buffer_full", Bridge: "b1",
		FirstReceivedAtMs: 1700000000100, LastReceivedAtMs: 1700000000200, RunStart: RunStartReconnect}
	msg := m.Msg()
	if msg.Subject != "fpmevents.drop.dynamo.backend.w%2E1.3" {
		t.Fatalf("subject %q", msg.Subject)
	}
	for h, want := range map[string]string{
		HeaderMsgID:     "drop:dynamo.backend.w%2E1.3:1700000000000:10:14:buffer_full",
		HeaderEventType: "drop_marker",
		HeaderBridge:    "b1",
		HeaderEpoch:     "1700000000000",
	} {
		if got := msg.Header.Get(h); got != want {
			t.Fatalf("%s = %q, want %q", h, got, want)
		}
	}
	back, err := ParseDropMarker(msg.Data)
	if err != nil || back != m {
		t.Fatalf("parsed %+v, %v; want %+v", back, err, m)
	}
	if !strings.Contains(string(msg.Data), `"key":{"namespace":"dynamo","component":"backend","worker_id":"w.1","dp_rank":3}`) {
		t.Fatalf("body %s does not carry the key object", msg.Data)
	}
}
