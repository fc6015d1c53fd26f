package gaps

import (
	"testing"

	"github.com/fpmbus/fpmbus/streams"
)

// fpmFrom applies seq observed at atMs under epoch, published by bridge.
func (s *script) fpmFrom(bridge string, seq uint64, epoch, atMs int64) {
	s.streamSeq++
	s.nowMs = max(s.nowMs, atMs)
	s.tr.observe(&fpmObservation{StreamSeq: s.streamSeq, StoredMs: s.nowMs, Seq: seq, ObservedAtMs: atMs, Epoch: epoch, Bridge: bridge})
}

// Redundant bridges publish one publisher under the epoch they agreed on; the stream holds the union of
// what they stored. A drop marker of one bridge must not report as lost what the other stored, even
// when the other's copies are stored after the marker; what neither stored is still a gap.
func TestRedundantBridgesMarkers(t *testing.T) {
	t.Parallel()
	const epoch = 1_000_000
	for name, tc := range map[string]struct {
		fillFirst, fillLast uint64 // what bridge b stores late of a's dropped 10..19 (fillLast < fillFirst: nothing)
		want                []evSummary
	}{
		"the other bridge stored every dropped FPM": {fillFirst: 10, fillLast: 19},
		"the other bridge stored some": {fillFirst: 10, fillLast: 14,
			want: []evSummary{{Type: TypeGap, Cause: CauseBridgeDrop, First: 15, Last: 19, Missing: 5, MarkerCount: 1, OldRunLast: -1}}},
		"no bridge stored them": {fillFirst: 1, fillLast: 0,
			want: []evSummary{{Type: TypeGap, Cause: CauseBridgeDrop, First: 10, Last: 19, Missing: 10, MarkerCount: 1, OldRunLast: -1}}},
	} {
		t.Run(name, func(t *testing.T) {
			s := newScript(t)
			at := int64(epoch)
			for q := uint64(0); q < 10; q++ { // both bridges live: the first copy of each is a's or b's
				s.fpmFrom([]string{"a", "b"}[q%2], q, epoch, at)
				at += 100
			}
			s.fpmFrom("a", 20, epoch, at) // a dropped 10..19 and says so; b lags behind
			s.tr.addMarker(streams.DropMarker{Type: streams.DropMarkerEvent, Key: tkey, Epoch: epoch, FirstSeq: 10, LastSeq: 19,
				Count: 10, Reason: "buffer_full", Bridge: "a"}, 1)
			if evs := s.events(); len(evs) != 0 {
				t.Fatalf("events before the grace: %+v", summarize(evs))
			}
			for q := tc.fillFirst; q <= tc.fillLast && q >= tc.fillFirst; q++ {
				s.fpmFrom("b", q, epoch, at+50)
			}
			s.fpmFrom("b", 21, epoch, at+100)
			s.tr.expire(s.nowMs + 10_000)
			got := summarize(s.events())
			if len(got) != len(tc.want) {
				t.Fatalf("events %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("event %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
			if s.st.Counters.Restarts != 0 {
				t.Fatalf("restarts %d: redundant bridges are not a publisher restart", s.st.Counters.Restarts)
			}
		})
	}
}

// One bridge: a gap fully covered by markers is classified at once, as before.
func TestSingleBridgeMarkerClassifiesAtOnce(t *testing.T) {
	t.Parallel()
	s := newScript(t)
	at := s.run(0, 9, 1_000_000, 1_000_000)
	s.fpm(20, 1_000_000, at)
	s.marker(1_000_000, 10, 19, "buffer_full")
	if got := summarize(s.events()); len(got) != 1 || got[0].Cause != CauseBridgeDrop || got[0].Missing != 10 {
		t.Fatalf("events %+v", got)
	}
	if s.st.Redundant {
		t.Fatal("one bridge taken for redundant ones")
	}
}
