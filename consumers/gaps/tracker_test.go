package gaps

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/fpmbus/fpmbus/streams"
)

var tkey = streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w1", DPRank: 0}

// script drives one tracker with FPMs and markers in a chosen order.
type script struct {
	t         testing.TB
	tr        *tracker
	st        *State
	streamSeq uint64
	nowMs     int64 // stream time of the next message
}

func newScript(t testing.TB) *script {
	st := &State{V: stateVersion, Key: tkey}
	return &script{t: t, st: st, tr: &tracker{key: tkey, st: st, r: rules{graceMs: 10_000, staleAfterMs: 5_000}}, nowMs: 1_000_000}
}

// fpm applies seq observed at atMs (bridge time) under epoch.
func (s *script) fpm(seq uint64, epoch, atMs int64) {
	s.streamSeq++
	s.nowMs = max(s.nowMs, atMs)
	s.tr.observe(&Observation{StreamSeq: s.streamSeq, StoredMs: s.nowMs, Seq: seq, ObservedAtMs: atMs, Epoch: epoch, Bridge: "b"})
}

// run applies seqs first..last, one per 100 ms from atMs.
func (s *script) run(first, last uint64, epoch, atMs int64) int64 {
	for q := first; q <= last; q++ {
		s.fpm(q, epoch, atMs)
		atMs += 100
	}
	return atMs
}

func (s *script) marker(epoch int64, first, last uint64, reason string) {
	s.streamSeq++
	s.tr.addMarker(streams.DropMarker{Type: streams.DropMarkerEvent, Key: tkey, Epoch: epoch, FirstSeq: first, LastSeq: last,
		Count: last - first + 1, Reason: reason, Bridge: "b"}, s.streamSeq)
}

// events returns and clears the outbox.
func (s *script) events() []Event {
	ev := s.st.Outbox
	s.st.Outbox = nil
	return ev
}

type evSummary struct {
	Type, Cause  string
	First, Last  int64 // -1 when absent
	Missing      uint64
	Restarted    *bool
	MarkerCount  int
	OldRunLast   int64
	BridgeChange bool
}

func summarize(evs []Event) []evSummary {
	var out []evSummary
	for _, e := range evs {
		s := evSummary{Type: e.Type, Cause: e.Cause, First: -1, Last: -1, Missing: e.Missing, Restarted: e.Restarted,
			MarkerCount: len(e.Evidence.Markers), OldRunLast: -1, BridgeChange: e.Evidence.EpochChanged}
		if e.FirstMissing != nil {
			s.First, s.Last = int64(*e.FirstMissing), int64(*e.LastMissing)
		}
		if e.Evidence.OldRun != nil {
			s.OldRunLast = int64(e.Evidence.OldRun.LastSeq)
		}
		out = append(out, s)
	}
	return out
}

func gapS(cause string, first, last int64) evSummary {
	return evSummary{Type: TypeGap, Cause: cause, First: first, Last: last, Missing: uint64(last - first + 1), OldRunLast: -1}
}

func TestTrackerScenarios(t *testing.T) {
	tru, fal := true, false
	tests := map[string]struct {
		play func(s *script)
		want []evSummary
	}{
		"a contiguous run reports nothing": {
			play: func(s *script) { s.run(0, 50, 1, 1000) },
		},
		"a jump without a marker is a zmq_drop once the grace has passed": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(15, 20, 1, at)
				check(s.t, len(s.st.Outbox) == 0, "held during the grace")
				equal(s.t, 0, s.tr.expire(s.nowMs+9_999))
				equal(s.t, 1, s.tr.expire(s.nowMs+10_000))
			},
			want: []evSummary{func() evSummary { e := gapS(CauseZMQDrop, 10, 14); return e }()},
		},
		"a marker stored before the jump makes it a bridge_drop at once": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.marker(1, 10, 14, "buffer_full")
				s.run(15, 20, 1, at)
			},
			want: []evSummary{func() evSummary { e := gapS(CauseBridgeDrop, 10, 14); e.MarkerCount = 1; return e }()},
		},
		"a marker stored after the jump makes it a bridge_drop when it arrives": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(15, 20, 1, at)
				s.marker(1, 10, 14, "buffer_full")
			},
			want: []evSummary{func() evSummary { e := gapS(CauseBridgeDrop, 10, 14); e.MarkerCount = 1; return e }()},
		},
		"two markers cover one gap: one bridge_drop event citing both": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(30, 31, 1, at)
				s.marker(1, 10, 19, "buffer_full")
				s.marker(1, 20, 29, "buffer_full")
			},
			want: []evSummary{func() evSummary { e := gapS(CauseBridgeDrop, 10, 29); e.MarkerCount = 2; return e }()},
		},
		"a partly covered gap splits by cause": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.marker(1, 12, 13, "buffer_full")
				s.run(20, 21, 1, at)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{gapS(CauseZMQDrop, 10, 11), func() evSummary { e := gapS(CauseBridgeDrop, 12, 13); e.MarkerCount = 1; return e }(), gapS(CauseZMQDrop, 14, 19)},
		},
		"a marker of another epoch does not cover": {
			play: func(s *script) {
				at := s.run(0, 9, 5, 1000)
				s.marker(3, 10, 14, "buffer_full")
				s.run(15, 16, 5, at)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{gapS(CauseZMQDrop, 10, 14)},
		},
		"the sequence going back under a new epoch is a publisher restart": {
			play: func(s *script) {
				at := s.run(0, 99, 1, 1000)
				s.run(0, 10, 2, at+500)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 99, BridgeChange: true}},
		},
		"a restart whose first numbers never arrived reports them after the grace": {
			play: func(s *script) {
				at := s.run(0, 99, 1, 1000)
				s.run(3, 10, 2, at+500)
				check(s.t, len(s.st.Outbox) == 0, "held")
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: 0, Last: 2, Missing: 3, OldRunLast: 99, BridgeChange: true}},
		},
		"a restart whose first numbers the bridge dropped": {
			play: func(s *script) {
				at := s.run(0, 99, 1, 1000)
				s.marker(2, 0, 2, "buffer_full")
				s.run(3, 10, 2, at+500)
			},
			want: []evSummary{
				{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 99, BridgeChange: true},
				func() evSummary { e := gapS(CauseBridgeDrop, 0, 2); e.MarkerCount = 1; e.BridgeChange = true; return e }(),
			},
		},
		"a new bridge epoch without a regression is not a restart": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(10, 20, 2, at)
			},
		},
		"a new bridge epoch across a jump: zmq_drop with the epoch change noted": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(14, 20, 2, at)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{func() evSummary { e := gapS(CauseZMQDrop, 10, 13); e.BridgeChange = true; return e }()},
		},
		"duplicates are counted, not reported": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.fpm(5, 1, at)
				s.fpm(9, 1, at)
				s.run(10, 12, 1, at)
				equal(s.t, uint64(2), s.st.Counters.Duplicates)
				equal(s.t, uint64(13), s.st.Counters.Messages)
			},
		},
		"out-of-order numbers fill the gap they were missing from": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(12, 13, 1, at)
				s.fpm(11, 1, at)
				s.fpm(10, 1, at)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.OutOfOrder)
				check(s.t, len(s.st.Pending) == 0, "pending %v", s.st.Pending)
			},
		},
		"a late number splits a gap in two": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(20, 20, 1, at)
				s.fpm(15, 1, at)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{gapS(CauseZMQDrop, 10, 14), gapS(CauseZMQDrop, 16, 19)},
		},
		"a late message of the old run after a restart is a duplicate": {
			play: func(s *script) {
				at := s.run(0, 9, 1, 1000)
				s.run(0, 2, 2, at)
				s.fpm(9, 1, at)
				equal(s.t, uint64(1), s.st.Counters.Duplicates)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 9, BridgeChange: true}},
		},
		"silence past stale-after, then the run goes on": {
			play: func(s *script) {
				at := s.run(0, 3, 1, 1000)
				s.run(4, 6, 1, at+5_001)
			},
			want: []evSummary{{Type: TypeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: TypeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1}},
		},
		"silence then a jump: the missing numbers are caused by the silence": {
			play: func(s *script) {
				at := s.run(0, 3, 1, 1000)
				s.run(20, 21, 1, at+20_000)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{{Type: TypeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: TypeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1},
				gapS(CauseStale, 4, 19)},
		},
		"silence then a restart": {
			play: func(s *script) {
				at := s.run(0, 30, 1, 1000)
				s.run(0, 1, 2, at+60_000)
			},
			want: []evSummary{{Type: TypeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 30, BridgeChange: true},
				{Type: TypeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &tru, OldRunLast: -1, BridgeChange: true}},
		},
		"stale by the wall clock, then resumed": {
			play: func(s *script) {
				at := s.run(0, 3, 1, 1000)
				check(s.t, s.tr.markStale(), "markStale")
				check(s.t, !s.tr.markStale(), "once per silence")
				s.run(4, 4, 1, at+100)
			},
			want: []evSummary{{Type: TypeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: TypeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newScript(t)
			tc.play(s)
			got := summarize(s.events())
			equal(t, tc.want, got)
		})
	}
}

func TestTrackerEventIDsAndNumbers(t *testing.T) {
	s := newScript(t)
	at := s.run(0, 9, 7, 1000)
	s.run(12, 12, 7, at)
	s.tr.expire(s.nowMs + 10_000)
	s.run(0, 0, 8, at+100)
	ev := s.events()
	equal(t, 2, len(ev))
	equal(t, "gap:dynamo.backend.w1.0:7:10-11", ev[0].ID)
	equal(t, "gap:dynamo.backend.w1.0:8:restart", ev[1].ID)
	equal(t, []uint64{1, 2}, []uint64{ev[0].EventSeq, ev[1].EventSeq})
	equal(t, EventSchema, ev[0].Schema)
	equal(t, uint64(9), ev[0].Before.Seq)
	equal(t, uint64(12), ev[0].After.Seq)
	equal(t, int64(1900), ev[0].Before.ObservedAtMs)
	equal(t, uint64(1), s.st.Counters.Gaps.ZMQDrop)
	equal(t, uint64(2), s.st.Counters.Missing.ZMQDrop)
	equal(t, uint64(1), s.st.Counters.Gaps.PublisherRestart)
}

// TestTrackerAccountsForEverySentNumber plays random scripts (ZMQ drops, bridge drops with markers
// before or after, reordering, duplicates) and checks that the events report exactly the numbers
// that never arrived, each once, with the right cause.
func TestTrackerAccountsForEverySentNumber(t *testing.T) {
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		s := newScript(t)
		const n = 400
		const epoch = 1
		fate := make([]byte, n) // d: delivered, z: zmq drop, b: bridge drop
		for i := range fate {
			fate[i] = 'd'
		}
		// the first and last are delivered, so every gap is bounded
		for i := 1; i < n-1; {
			switch x := r.IntN(20); {
			case x == 0:
				l := 1 + r.IntN(5)
				for j := i; j < min(i+l, n-1); j++ {
					fate[j] = 'z'
				}
				i += l
			case x == 1:
				l := 1 + r.IntN(8)
				for j := i; j < min(i+l, n-1); j++ {
					fate[j] = 'b'
				}
				i += l
			default:
				i++
			}
		}
		var order []uint64
		for i := range fate {
			if fate[i] == 'd' {
				order = append(order, uint64(i))
			}
		}
		// local reordering and duplicates
		for i := 1; i < len(order); i++ {
			if r.IntN(15) == 0 {
				order[i-1], order[i] = order[i], order[i-1]
			}
		}
		var dups []int
		for i := range order {
			if r.IntN(25) == 0 {
				dups = append(dups, i)
			}
		}
		for _, i := range slices.Backward(dups) {
			order = slices.Insert(order, i+1, order[i])
		}
		// bridge-drop markers: each maximal 'b' run, delivered before or after the FPMs
		type mk struct{ first, last uint64 }
		var markers []mk
		for i := 0; i < n; {
			if fate[i] != 'b' {
				i++
				continue
			}
			j := i
			for j+1 < n && fate[j+1] == 'b' {
				j++
			}
			markers = append(markers, mk{uint64(i), uint64(j)})
			i = j + 1
		}
		early := r.IntN(2) == 0
		if early {
			for _, m := range markers {
				s.marker(epoch, m.first, m.last, "buffer_full")
			}
		}
		at := int64(1000)
		for _, q := range order {
			s.fpm(q, epoch, at)
			at += 10
		}
		if !early {
			for _, m := range markers {
				s.marker(epoch, m.first, m.last, "buffer_full")
			}
		}
		s.tr.expire(s.nowMs + 10_000)
		check(t, len(s.st.Pending) == 0, "seed %d: pending %v", seed, s.st.Pending)
		got := make([]byte, n)
		for i := range got {
			got[i] = 'd'
		}
		var missing uint64
		for _, e := range s.events() {
			equal(t, TypeGap, e.Type, "seed ", seed)
			c := byte('z')
			if e.Cause == CauseBridgeDrop {
				c = 'b'
			}
			for q := *e.FirstMissing; q <= *e.LastMissing; q++ {
				check(t, got[q] == 'd', "seed %d: seq %d reported twice", seed, q)
				got[q] = c
			}
			missing += e.Missing
		}
		equal(t, string(fate), string(got), "seed ", seed)
		equal(t, uint64(n), s.st.Counters.Messages+missing, "delivered + missing != sent, seed ", seed)
	}
}
