package streams

import (
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

func TestFPMMsgID(t *testing.T) {
	k := Key{Namespace: "dynamo", Component: "backend", WorkerID: "w:1", DPRank: 0}
	other := Key{Namespace: "dynamo", Component: "backend", WorkerID: "w", DPRank: 1}
	busy := func(seq int64, wall float64) []byte {
		return schemas.EncodeMsgpack(&schemas.FPM{Version: 1, WorkerID: "w", CounterID: seq, WallTime: wall,
			Scheduled: schemas.ScheduledRequests{NumDecodeRequests: 3, SumDecodeKVTokens: 1024}})
	}
	idle := func(seq int64) []byte {
		return schemas.EncodeMsgpack(&schemas.FPM{Version: 1, WorkerID: "w", CounterID: seq})
	}
	type fpm struct {
		k       Key
		seq     uint64
		payload []byte
		epoch   int64 // the run's agreed epoch
	}
	id := func(f fpm) string { return FPMMsgID(f.k, f.seq, PayloadDigest(f.payload), f.epoch) }
	for name, tc := range map[string]struct {
		a, b fpm
		same bool
	}{
		// One FPM as two bridges that agreed on its run receive it: the same bytes at the same seq.
		"busy, two bridges":      {fpm{k, 7, busy(7, 0.025), 100}, fpm{k, 7, busy(7, 0.025), 100}, true},
		"heartbeat, two bridges": {fpm{k, 3, idle(3), 100}, fpm{k, 3, idle(3), 100}, true},
		// Two runs are two runs, even when their bytes agree (a recording replayed twice).
		"busy, two runs, same bytes":       {fpm{k, 7, busy(7, 0.025), 100}, fpm{k, 7, busy(7, 0.025), 200}, false},
		"busy, two runs, adjacent ms":      {fpm{k, 7, busy(7, 0.025), 100}, fpm{k, 7, busy(7, 0.025), 101}, false},
		"heartbeat, two runs, same seq":    {fpm{k, 3, idle(3), 100}, fpm{k, 3, idle(3), 200}, false},
		"heartbeat, two runs, adjacent ms": {fpm{k, 3, idle(3), 100}, fpm{k, 3, idle(3), 101}, false},
		// A new run wrongly tagged with the old run's epoch still differs by its payload.
		"busy, two runs, one epoch":         {fpm{k, 7, busy(7, 0.025), 100}, fpm{k, 7, busy(7, 0.026), 100}, false},
		"busy, next seq":                    {fpm{k, 7, busy(7, 0.025), 100}, fpm{k, 8, busy(8, 0.025), 100}, false},
		"busy, another publisher":           {fpm{k, 7, busy(7, 0.025), 100}, fpm{other, 7, busy(7, 0.025), 100}, false},
		"heartbeat, next seq":               {fpm{k, 3, idle(3), 100}, fpm{k, 4, idle(4), 100}, false},
		"heartbeat and busy, same seq":      {fpm{k, 3, idle(3), 100}, fpm{k, 3, busy(3, 0.025), 100}, false},
		"heartbeat, another publisher":      {fpm{k, 3, idle(3), 100}, fpm{other, 3, idle(3), 100}, false},
		"worker id with a colon is escaped": {fpm{Key{"dynamo", "backend", "w", 0}, 1, idle(1), 100}, fpm{Key{"dynamo", "backend", "w:1", 0}, 1, idle(1), 100}, false},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := id(tc.a), id(tc.b)
			if (a == b) != tc.same {
				t.Fatalf("ids %q and %q: same %v, want %v", a, b, a == b, tc.same)
			}
		})
	}
}

func TestFPMMsgIDFormat(t *testing.T) {
	k := Key{Namespace: "dynamo", Component: "backend", WorkerID: "4192", DPRank: 0}
	d := PayloadDigest([]byte("x"))
	if len(d) != 32 || strings.Trim(d, "0123456789abcdef") != "" {
		t.Fatalf("digest %q: want 32 lowercase hex digits", d)
	}
	if got, want := FPMMsgID(k, 42, d, 99), "dynamo.backend.4192.0:42:"+d+":e99"; got != want {
		t.Fatalf("id %q, want %q", got, want)
	}
}
