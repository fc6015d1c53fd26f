package producer

import (
	"reflect"
	"testing"

	"github.com/fpmbus/fpmbus/schemas"
)

func TestEngineDeterministic(t *testing.T) {
	run := func(seed int64, rank int) []schemas.FPM {
		e := NewEngine(seed, "w", rank)
		var out []schemas.FPM
		for range 3000 {
			if f, ok := e.Step(); ok {
				out = append(out, f)
			}
		}
		return out
	}
	a, b := run(7, 0), run(7, 0)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed and rank gave different FPMs")
	}
	if reflect.DeepEqual(a, run(8, 0)) {
		t.Error("different seeds gave the same FPMs")
	}
	if reflect.DeepEqual(a, run(7, 1)) {
		t.Error("different ranks gave the same FPMs")
	}
}

// TestEngineChunkedPrefillThenDecode follows one request with a prefix-cache hit through chunked prefill
// and decode, with arrivals switched off.
func TestEngineChunkedPrefillThenDecode(t *testing.T) {
	e := NewEngine(1, "w", 3)
	e.arrivalRate = 0
	e.waiting = []*simRequest{{prompt: 3000, output: 4, prefixHit: 512, target: 3000}}
	want := []schemas.ScheduledRequests{
		{NumPrefillRequests: 1, SumPrefillTokens: 2048, SumPrefillKVTokens: 512}, // first chunk after the hit
		{NumPrefillRequests: 1, SumPrefillTokens: 440, SumPrefillKVTokens: 2560}, // last chunk, samples token 1
		{NumDecodeRequests: 1, SumDecodeKVTokens: 3000},
		{NumDecodeRequests: 1, SumDecodeKVTokens: 3001},
		{NumDecodeRequests: 1, SumDecodeKVTokens: 3002}, // token 4: finished
	}
	for i, w := range want {
		f, ok := e.Step()
		if !ok {
			t.Fatalf("step %d: empty batch", i+1)
		}
		if f.Scheduled != w {
			t.Errorf("step %d: scheduled = %+v, want %+v", i+1, f.Scheduled, w)
		}
		if f.Queued != (schemas.QueuedRequests{}) || f.WallTime <= 0 || f.DPRank != 3 || f.WorkerID != "w" ||
			f.Version != 1 || f.CounterID != 0 {
			t.Errorf("step %d: fpm = %+v", i+1, f)
		}
	}
	if f, ok := e.Step(); ok {
		t.Fatalf("step after the request finished: got %+v, want an empty batch", f)
	}
	if e.kvUsed != 0 || len(e.running) != 0 {
		t.Fatalf("after finishing: kvUsed %d, running %d", e.kvUsed, len(e.running))
	}
}

// TestEnginePlausible checks every FPM of a long run against the FPM rules and the scheduler limits, and
// that the run exercises every field.
func TestEnginePlausible(t *testing.T) {
	e := NewEngine(42, "worker-a", 0)
	var seen struct{ prefill, prefixKV, decode, queuedPrefill, queuedDecode, empty int }
	for i := range 20000 {
		f, ok := e.Step()
		if !ok {
			seen.empty++
			continue
		}
		got, err := schemas.DecodeFPM(schemas.EncodeMsgpack(&f))
		if err != nil {
			t.Fatalf("step %d: %+v does not validate: %v", i, f, err)
		}
		got.JSON = nil
		if !reflect.DeepEqual(*got, f) {
			t.Fatalf("step %d: round trip %+v != %+v", i, *got, f)
		}
		s, q := f.Scheduled, f.Queued
		if s.NumPrefillRequests+s.NumDecodeRequests == 0 || f.WallTime <= 0 {
			t.Fatalf("step %d: published an empty batch: %+v", i, f)
		}
		if s.NumPrefillRequests+s.NumDecodeRequests > simMaxRunning ||
			s.SumPrefillTokens+s.NumDecodeRequests > simMaxBatchTokens {
			t.Fatalf("step %d: batch beyond the scheduler limits: %+v", i, s)
		}
		if (s.NumPrefillRequests == 0) != (s.SumPrefillTokens == 0) || (s.NumDecodeRequests == 0) != (s.SumDecodeKVTokens == 0) {
			t.Fatalf("step %d: counts and sums disagree: %+v", i, s)
		}
		if s.NumPrefillRequests > 0 {
			seen.prefill++
		}
		if s.SumPrefillKVTokens > 0 {
			seen.prefixKV++
		}
		if s.NumDecodeRequests > 0 {
			seen.decode++
		}
		if q.NumPrefillRequests > 0 {
			seen.queuedPrefill++
		}
		if q.NumDecodeRequests > 0 {
			seen.queuedDecode++
		}
	}
	t.Logf("steps with: %+v", seen)
	if seen.prefill == 0 || seen.prefixKV == 0 || seen.decode == 0 || seen.queuedPrefill == 0 || seen.queuedDecode == 0 {
		t.Errorf("some fields never exercised: %+v", seen)
	}
}

func TestHeartbeatIsAllZero(t *testing.T) {
	h := Heartbeat("w", 2, 17)
	if !h.IsHeartbeat() || h.Version != 1 || h.WorkerID != "w" || h.DPRank != 2 || h.CounterID != 17 {
		t.Fatalf("Heartbeat = %+v", h)
	}
}

func BenchmarkEngineStep(b *testing.B) {
	e := NewEngine(1, "w", 0)
	for b.Loop() {
		e.Step()
	}
}
