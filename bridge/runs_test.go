package bridge

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
	"github.com/fpmbus/fpmbus/streams/streamstest"
)

// The agreement rules of runs.go against a real bucket: when a bridge adopts the recorded run and when
// it writes a new one.
func TestAgreeRun(t *testing.T) {
	t.Parallel()
	env := streamstest.Start(t)
	h := startBridge(t, env, []Endpoint{{URL: "tcp://127.0.0.1:1", DPRank: 0}}, nil)
	b := h.b
	if b.runsKV == nil {
		t.Fatal("runs bucket not open")
	}
	start := b.startMs
	type stored struct{ receivedAtMs int64 } // the newest FPM of the key in the stream
	for name, tc := range map[string]struct {
		rec       *streams.RunRecord // the record before; nil: none
		stored    *stored
		restarted bool
		prev      int64 // the previous run's agreed epoch (restarted)
		local     int64
		want      int64
		written   bool // the bridge wrote the record (else adopted it)
	}{
		"first bridge ever":                       {local: start + 5, want: start + 5, written: true},
		"starting alone: a new epoch":             {rec: &streams.RunRecord{Epoch: start + 50}, stored: &stored{start - 1000}, local: start + 5, want: start + 51, written: true},
		"starting alone, nothing stored":          {rec: &streams.RunRecord{Epoch: start - 50}, local: start + 5, want: start + 5, written: true},
		"starting while another bridge is live":   {rec: &streams.RunRecord{Epoch: start - 50}, stored: &stored{start + 1}, local: start + 5, want: start - 50},
		"restart the other bridge recorded first": {rec: &streams.RunRecord{Epoch: start + 3, Restart: true}, restarted: true, prev: start - 50, local: start + 5, want: start + 3},
		"restart seen first":                      {rec: &streams.RunRecord{Epoch: start - 50, Restart: true}, restarted: true, prev: start - 50, local: start + 5, want: start + 5, written: true},
		"restart after a starting bridge's epoch": {rec: &streams.RunRecord{Epoch: start + 3}, restarted: true, prev: start - 50, local: start + 2, want: start + 4, written: true},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			k := streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: name, DPRank: 0}
			if tc.rec != nil {
				tc.rec.Key = k
				body, _ := json.Marshal(tc.rec)
				if _, err := b.runsKV.Put(ctx, streams.BridgeRunKey(k), body); err != nil {
					t.Fatal(err)
				}
			}
			if tc.stored != nil {
				m := nats.NewMsg(streams.FPMSubject(k))
				m.Header.Set(streams.HeaderReceivedAt, strconv.FormatInt(tc.stored.receivedAtMs, 10))
				m.Data = []byte(`{}`)
				if _, err := env.JS.PublishMsg(ctx, m); err != nil {
					t.Fatal(err)
				}
			}
			r := newRun(k, tc.local, 7, nil)
			r.restarted = tc.restarted
			got, err := b.agreeRun(r, tc.prev)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("epoch %d, want %d (start %d)", got, tc.want, start)
			}
			e, err := b.runsKV.Get(ctx, streams.BridgeRunKey(k))
			if err != nil {
				t.Fatal(err)
			}
			var rec streams.RunRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				t.Fatal(err)
			}
			if rec.Epoch != tc.want || (rec.Bridge == "test-bridge") != tc.written || (tc.written && rec.Restart != tc.restarted) {
				t.Fatalf("record %+v after agreeing on %d (written: %v)", rec, tc.want, tc.written)
			}
		})
	}
}
