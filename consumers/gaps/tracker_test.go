package gaps

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/fpmbus/fpmbus/streams"
)

var tkey = streams.Key{Namespace: "dynamo", Component: "backend", WorkerID: "w1", DPRank: 0}

// script drives one tracker with FPMs and markers in a chosen order.
type script struct {
	t         testing.TB
	tr        *tracker
	st        *state
	streamSeq uint64
	nowMs     int64 // stream time of the next message
	// runStart is the Fpm-Run-Start the bridges stamp per epoch (absent: a bridge's first run).
	runStart map[int64]string
}

func newScript(t testing.TB) *script {
	st := &state{V: stateVersion, Key: tkey}
	return &script{t: t, st: st, tr: &tracker{key: tkey, st: st, r: rules{graceMs: 10_000, staleAfterMs: 5_000}}, nowMs: 1_000_000}
}

// fpm applies seq observed at atMs (bridge time) under epoch.
func (s *script) fpm(seq uint64, epoch, atMs int64) {
	s.streamSeq++
	s.nowMs = max(s.nowMs, atMs)
	s.tr.observe(&fpmObservation{StreamSeq: s.streamSeq, StoredMs: s.nowMs, Seq: seq, ObservedAtMs: atMs, Epoch: epoch, Bridge: "b",
		RunStart: s.runStart[epoch]})
}

// run applies seqs first..last, one per 100 ms from atMs.
func (s *script) run(first, last uint64, epoch, atMs int64) int64 {
	for q := first; q <= last; q++ {
		s.fpm(q, epoch, atMs)
		atMs += 100
	}
	return atMs
}

// restartMarker is bridge's shutdown marker of first..last under epoch, received from firstMs to
// lastMs, of a run it saw begin as a restart; firstRunMarker the same of its first run of the publisher.
func restartMarker(bridge string, epoch int64, first, last uint64, firstMs, lastMs int64) streams.DropMarker {
	m := firstRunMarker(bridge, epoch, first, last, firstMs, lastMs)
	m.RunStart = streams.RunStartRestart
	return m
}

func firstRunMarker(bridge string, epoch int64, first, last uint64, firstMs, lastMs int64) streams.DropMarker {
	return streams.DropMarker{Type: streams.DropMarkerEvent, Key: tkey, Epoch: epoch, FirstSeq: first, LastSeq: last,
		Count: last - first + 1, Reason: "shutdown", Bridge: bridge, FirstReceivedAtMs: firstMs, LastReceivedAtMs: lastMs}
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
	t.Parallel()
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
		// A run the bridge began on a new connection, further on than the old run's last: the publisher
		// may have restarted while the bridge was disconnected. Every number before the first received
		// is named, under the new epoch (a guess of continuity would have named 10-24 only, and under
		// the old run's account).
		"a reconnect further on is a new run of unknown start": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartReconnect}
				at := s.run(0, 9, 1, 1000)
				s.run(25, 30, 2, at+300)
				check(s.t, len(s.st.Outbox) == 0, "held for the grace")
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				check(s.t, s.st.Run.ByRestart && s.st.Run.FirstSeq == 25, "run %+v", s.st.Run)
			},
			want: []evSummary{{Type: TypeGap, Cause: causeReconnect, First: 0, Last: 24, Missing: 25, OldRunLast: 9, BridgeChange: true}},
		},
		// A redundant bridge that saw the sequence go back stores the new run's first numbers later: they
		// fill the gap and show the restart is one.
		"a reconnect whose first numbers another bridge stored later is a publisher restart": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartReconnect}
				at := s.run(0, 9, 1, 1000)
				at = s.run(25, 30, 2, at+300)
				s.run(4, 24, 2, at)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: 0, Last: 3, Missing: 4, OldRunLast: 9, BridgeChange: true}},
		},
		"a restart the bridges saw, read first from a copy further on": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartRestart}
				at := s.run(0, 9, 1, 1000)
				s.run(25, 30, 2, at+300)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: 0, Last: 24, Missing: 25, OldRunLast: 9, BridgeChange: true}},
		},
		"a reconnect that goes back is a publisher restart": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartReconnect}
				at := s.run(0, 99, 1, 1000)
				s.run(0, 10, 2, at+500)
			},
			want: []evSummary{{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 99, BridgeChange: true}},
		},
		"a reconnect after silence: resumed says the publisher may have restarted": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartReconnect}
				at := s.run(0, 9, 1, 1000)
				s.tr.markStale()
				s.run(40, 41, 2, at+8000)
				s.tr.expire(s.nowMs + 10_000)
				ev := s.st.Outbox
				check(s.t, len(ev) == 3 && ev[1].Type == typeResumed && strings.Contains(ev[1].Evidence.Summary, "may have restarted"), "events %+v", ev)
			},
			want: []evSummary{{Type: typeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: typeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &tru, OldRunLast: -1, BridgeChange: true},
				{Type: TypeGap, Cause: causeReconnect, First: 0, Last: 39, Missing: 40, OldRunLast: 9, BridgeChange: true}},
		},
		"the same reconnect's run-start on later FPMs of the epoch is no new restart": {
			play: func(s *script) {
				s.runStart = map[int64]string{2: streams.RunStartReconnect}
				at := s.run(0, 9, 1, 1000)
				at = s.run(25, 30, 2, at+300)
				s.run(32, 40, 2, at)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
			},
			want: []evSummary{{Type: TypeGap, Cause: causeReconnect, First: 0, Last: 24, Missing: 25, OldRunLast: 9, BridgeChange: true},
				func() evSummary { e := gapS(CauseZMQDrop, 31, 31); return e }()},
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
			want: []evSummary{{Type: typeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: typeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1}},
		},
		"silence then a jump: the missing numbers are caused by the silence": {
			play: func(s *script) {
				at := s.run(0, 3, 1, 1000)
				s.run(20, 21, 1, at+20_000)
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []evSummary{{Type: typeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: typeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1},
				gapS(CauseStale, 4, 19)},
		},
		"silence then a restart": {
			play: func(s *script) {
				at := s.run(0, 30, 1, 1000)
				s.run(0, 1, 2, at+60_000)
			},
			want: []evSummary{{Type: typeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: TypeGap, Cause: CausePublisherRestart, First: -1, Last: -1, OldRunLast: 30, BridgeChange: true},
				{Type: typeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &tru, OldRunLast: -1, BridgeChange: true}},
		},
		"stale by the wall clock, then resumed": {
			play: func(s *script) {
				at := s.run(0, 3, 1, 1000)
				check(s.t, s.tr.markStale(), "markStale")
				check(s.t, !s.tr.markStale(), "once per silence")
				s.run(4, 4, 1, at+100)
			},
			want: []evSummary{{Type: typeStale, Cause: CauseStale, First: -1, Last: -1, OldRunLast: -1},
				{Type: typeResumed, Cause: CauseStale, First: -1, Last: -1, Restarted: &fal, OldRunLast: -1}},
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
	t.Parallel()
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
	t.Parallel()
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

// reload replaces the tracker's state by its JSON checkpoint read back, as a detector restarted (or a
// new owner of the publisher) would continue from it.
func (s *script) reload() {
	b, err := json.Marshal(s.st)
	if err != nil {
		s.t.Fatal(err)
	}
	st := &state{}
	if err := json.Unmarshal(b, st); err != nil {
		s.t.Fatal(err)
	}
	s.st, s.tr.st = st, st
}

// epochSummary is "cause@epoch" or "cause@epoch:first-last" for each gap event.
func epochSummary(evs []Event) []string {
	var out []string
	for _, e := range evs {
		s := fmt.Sprintf("%s@%d", e.Cause, e.Epoch)
		if e.Type == TypeRecovered {
			s = "recovered " + s
		}
		if e.FirstMissing != nil {
			s += fmt.Sprintf(":%d-%d", *e.FirstMissing, *e.LastMissing)
		}
		out = append(out, s)
	}
	return out
}

// TestTrackerEpochs: gaps of every publisher run are classified, whatever run is current when their
// grace passes or their marker or late number arrives, and the numbers before the first one seen of
// a publisher are a late_start gap. Each scenario runs twice: straight, and with the state read back
// from its JSON checkpoint before every step.
func TestTrackerEpochs(t *testing.T) {
	t.Parallel()
	const t0 = 1_000_000 // observed and stream time of the first message
	tests := map[string]struct {
		play func(s *script, step func())
		want []string
	}{
		"skips in every run, each classified under its run's epoch": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				at = s.run(11, 20, 1, at)
				step()
				at = s.run(0, 4, 2, at+500)
				at = s.run(6, 9, 2, at)
				step()
				at = s.run(0, 2, 3, at+500)
				s.run(4, 6, 3, at)
				step()
				equal(s.t, []string{"publisher_restart@2", "publisher_restart@3"}, epochSummary(s.st.Outbox), "before the grace")
				equal(s.t, 3, len(s.st.Pending))
				equal(s.t, 3, s.tr.expire(s.nowMs+10_000))
			},
			want: []string{"publisher_restart@2", "publisher_restart@3", "zmq_drop@1:10-10", "zmq_drop@2:5-5", "zmq_drop@3:3-3"},
		},
		"a restart while a gap waits for its grace: the old run's gap keeps its own grace": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				s.run(12, 12, 1, at)
				revealed := s.nowMs
				step()
				s.run(0, 5, 2, revealed+2_000) // stream time moves on with the new run
				step()
				equal(s.t, 0, s.tr.expire(revealed+9_999))
				step()
				equal(s.t, 1, s.tr.expire(revealed+10_000))
			},
			want: []string{"publisher_restart@2", "zmq_drop@1:10-11"},
		},
		"a gap revealed by the restarted run's first numbers and an old run's gap, both pending": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				at = s.run(15, 20, 1, at)
				step()
				s.run(3, 8, 2, at+100)
				step()
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []string{"zmq_drop@1:10-14", "publisher_restart@2:0-2"},
		},
		"a drop marker of the old run after a restart still covers its gap": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				at = s.run(15, 20, 1, at)
				s.run(0, 3, 2, at+100)
				step()
				s.marker(1, 10, 14, "buffer_full")
			},
			want: []string{"publisher_restart@2", "bridge_drop@1:10-14"},
		},
		"a late number of the old run after a restart fills its gap": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				at = s.run(12, 20, 1, at)
				s.run(0, 3, 2, at+100)
				step()
				s.fpm(10, 1, at)
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.OutOfOrder)
			},
			want: []string{"publisher_restart@2", "zmq_drop@1:11-11"},
		},
		"a late start: the numbers before the first one seen": {
			play: func(s *script, step func()) {
				s.fpm(1310, 1, t0)
				revealed := s.nowMs // the grace counts from the first message seen
				s.run(1311, 1320, 1, t0+100)
				step()
				equal(s.t, 0, s.tr.expire(revealed+9_999))
				step()
				equal(s.t, 1, s.tr.expire(revealed+10_000))
				equal(s.t, uint64(1310), s.st.Counters.Missing.LateStart)
				equal(s.t, uint64(11), s.st.Counters.Messages)
			},
			want: []string{"late_start@1:0-1309"},
		},
		"a late start whose first numbers the bridge dropped: bridge_drop, late_start before them, zmq_drop after": {
			play: func(s *script, step func()) {
				s.marker(1, 5, 9, "buffer_full")
				step()
				s.run(20, 25, 1, t0)
				step()
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []string{"late_start@1:0-4", "bridge_drop@1:5-9", "zmq_drop@1:10-19"},
		},
		"a late start shrinks when earlier numbers arrive late": {
			play: func(s *script, step func()) {
				at := s.run(10, 12, 1, t0)
				step()
				s.fpm(3, 1, at)
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.OutOfOrder)
				equal(s.t, uint64(3), s.st.Run.FirstSeq)
			},
			want: []string{"late_start@1:0-2", "zmq_drop@1:4-9"},
		},
		"seq 0 arriving late: no late start": {
			play: func(s *script, step func()) {
				at := s.run(3, 8, 1, t0)
				step()
				s.run(0, 2, 1, at)
				step()
				check(s.t, len(s.st.Pending) == 0, "pending %v", s.st.Pending)
				equal(s.t, uint64(9), s.st.Counters.Messages)
			},
		},
		"a late start, then a restart within its grace": {
			play: func(s *script, step func()) {
				at := s.run(100, 110, 1, t0)
				step()
				at = s.run(0, 5, 2, at+100)
				s.run(7, 9, 2, at)
				step()
				s.tr.expire(s.nowMs + 10_000)
			},
			want: []string{"publisher_restart@2", "late_start@1:0-99", "zmq_drop@2:6-6"},
		},
		// The stream holds it: a bridge stored it after the late_start event named it. It is a message,
		// taken back from the late_start count, never a duplicate; a second copy is one.
		"a number below the first seen, stored after its late_start was reported, is taken back": {
			play: func(s *script, step func()) {
				at := s.run(50, 60, 1, t0)
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.fpm(20, 1, at)
				s.fpm(21, 1, at)
				step()
				s.fpm(20, 1, at)
				s.tr.flushRecovered() // the detector's clock
				equal(s.t, uint64(13), s.st.Counters.Messages)
				equal(s.t, uint64(1), s.st.Counters.Duplicates)
				equal(s.t, uint64(2), s.st.Counters.Recovered)
				equal(s.t, uint64(48), s.st.Counters.Missing.LateStart)
			},
			want: []string{"late_start@1:0-49", "recovered late_start@1:20-21"},
		},
		// The bridge saw the publisher restart while its store refused writes, could neither record the
		// run nor store any of it, and stopped, dropping its first numbers (a marker from seq 0 under
		// the run's epoch); started again, it took the run's later numbers for the old run going on.
		// The marker shows the restart: the new run's numbers before its first FPM are named under it.
		"a restart only a drop marker saw begin": {
			play: func(s *script, step func()) {
				at := s.run(0, 39, 1, t0)
				s.marker(1, 40, 45, "shutdown") // the old run's last numbers, dropped
				s.marker(2, 0, 9, "shutdown")   // the new run's first ones, under its epoch
				step()
				s.run(60, 70, 3, at+3_000) // the bridge started again: no run start
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(10+6), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(50), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, int64(2), s.st.Run.FirstEpoch)
			},
			want: []string{"bridge_drop@1:40-45", "publisher_restart@3:10-59", "bridge_drop@3:0-9"},
		},
		// The same, the bridge having missed the new run's first number (it subscribed after the
		// publisher sent it): its marker begins at 1, below the last number it stored of the old run,
		// which only a new run can.
		"a restart only a drop marker from past seq 0 saw begin": {
			play: func(s *script, step func()) {
				at := s.run(0, 39, 1, t0)
				s.marker(1, 40, 45, "shutdown")
				s.marker(2, 1, 9, "shutdown")
				step()
				s.run(60, 70, 3, at+3_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(9+6), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(51), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, int64(2), s.st.Run.FirstEpoch)
			},
			want: []string{"bridge_drop@1:40-45", "publisher_restart@3:0-59", "bridge_drop@3:1-9"},
		},
		// The bridge was killed while the run went on, started again on a full store, received the run's
		// later numbers, could store none and stopped (a marker of them under its epoch); started once
		// more, it received a rerun's numbers, taken for its first run (no run start), above the last
		// FPM stored but below the marker's last. The marker shows the run got past them before: the
		// sequence went back, a restart; the old run's numbers up to the marker are named under its
		// epochs, the new run's before its first FPM under the new one.
		"a bridge's first run below where its own earlier drop marker shows the run got": {
			play: func(s *script, step func()) {
				at := s.run(0, 26, 1, t0)
				s.marker(2, 75, 105, "shutdown") // the run going on, dropped by the bridge's next start
				step()
				s.run(30, 40, 3, at+45_000) // the bridge's third start: a rerun, no run start
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(31), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(30), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, int64(3), s.st.Run.FirstEpoch)
			},
			want: []string{"stale@1", "stale@3", "zmq_drop@2:27-74", "bridge_drop@2:75-105", "publisher_restart@3:0-29"},
		},
		// The bridge that stored the last FPM seen stopped, started again on the publisher's next run,
		// received its numbers from below that FPM's (the sequence went back), could store none and
		// stopped (a marker of them under its new epoch, spooled and published when it started once
		// more); the next FPM is another bridge's first run. The marker shows the restart all the same.
		"a restart the last FPM's bridge's marker shows, the next FPM another bridge's": {
			play: func(s *script, step func()) {
				at := s.run(0, 214, 1, t0)
				s.tr.addMarker(firstRunMarker("b", 2, 62, 265, at+40_000, at+50_000), 100)
				step()
				s.fpmFrom("c", 490, 3, at+60_000) // another bridge's first run: no run start
				s.fpmFrom("c", 491, 3, at+60_050)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(204), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(490-204), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, int64(2), s.st.Run.FirstEpoch)
			},
			want: []string{"stale@1", "stale@3", "publisher_restart@3:0-489", "bridge_drop@3:62-265"},
		},
		// The publisher restarted while the store refused writes: the redundant bridge saw it restart,
		// received its numbers from 3 (0-2 were sent before it was subscribed to the new process), could
		// store none and was stopped (its marker spooled); the run was killed, and the next run's first
		// FPM (a restart both bridges saw) is all that follows. The marker is all that was stored of the
		// run: its numbers are the report's (unrevealed.go), those below them are the run's restart's.
		"a run only a restart marker saw, followed by the next run": {
			play: func(s *script, step func()) {
				s.runStart = map[int64]string{3: streams.RunStartRestart}
				at := s.run(0, 46, 1, t0)
				s.tr.addMarker(restartMarker("c", at+1_700, 3, 12, at+1_700, at+2_150), 100)
				step()
				s.fpm(0, at+14_000, at+14_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Restarts)
				equal(s.t, uint64(3), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, uint64(48), s.st.Counters.Messages)
			},
			want: []string{"stale@1", fmt.Sprintf("publisher_restart@%d:0-2", 1_000_000+47*100+1_700), fmt.Sprintf("publisher_restart@%d", 1_000_000+47*100+14_000), fmt.Sprintf("stale@%d", 1_000_000+47*100+14_000)},
		},
		// The next run's first FPM here is 1 (its 0 was lost), the number the marker's run began with:
		// numbers gone back, 40 s after the marker's last, a later run all the same.
		"a run only restart markers saw, the next run's first number the same as theirs": {
			play: func(s *script, step func()) {
				s.runStart = map[int64]string{3: streams.RunStartRestart}
				at := s.run(0, 46, 1, t0)
				s.tr.addMarker(restartMarker("c", at+1_700, 1, 9, at+1_700, at+2_100), 100)
				s.tr.addMarker(restartMarker("d", at+1_700, 1, 6, at+1_700, at+1_950), 101)
				step()
				s.runStart[at+40_000] = streams.RunStartRestart
				s.fpm(1, at+40_000, at+40_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Missing.PublisherRestart) // 0 of each run
			},
			want: []string{"stale@1", fmt.Sprintf("publisher_restart@%d:0-0", 1_000_000+47*100+1_700), fmt.Sprintf("stale@%d", 1_000_000+47*100+40_000), fmt.Sprintf("publisher_restart@%d:0-0", 1_000_000+47*100+40_000)},
		},
		"a run only a restart marker saw, the marker read after the next run's first FPM": {
			play: func(s *script, step func()) {
				at := s.run(0, 46, 1, t0)
				s.runStart = map[int64]string{at + 14_000: streams.RunStartRestart}
				s.fpm(0, at+14_000, at+14_000)
				s.run(1, 5, at+14_000, at+14_100)
				step()
				s.tr.addMarker(restartMarker("c", at+1_700, 3, 12, at+1_700, at+2_150), 100)
				step()
				// A second copy of the marker's run from another bridge, its epoch about the same: one run.
				s.tr.addMarker(restartMarker("d", at+1_750, 4, 9, at+1_750, at+2_000), 101)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(3), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"stale@1", fmt.Sprintf("publisher_restart@%d", 1_000_000+47*100+14_000), fmt.Sprintf("stale@%d", 1_000_000+47*100+14_000), fmt.Sprintf("publisher_restart@%d:0-2", 1_000_000+47*100+1_700)},
		},
		// Nothing tells the numbers below a marker's first from numbers its bridge never received in
		// the run: a marker of a bridge's first run of the publisher (no run start: it cannot tell a
		// restart from the run going on), or one whose bridge received the run's earlier numbers and
		// stored or dropped them otherwise (its first receive is the epoch, before the marker's first).
		"a marker-only run whose start no bridge saw, or whose first numbers its bridge received, is not named": {
			play: func(s *script, step func()) {
				s.runStart = map[int64]string{3: streams.RunStartRestart}
				at := s.run(0, 46, 1, t0)
				s.tr.addMarker(firstRunMarker("c", at+1_700, 3, 12, at+1_700, at+2_150), 100)
				s.tr.addMarker(restartMarker("c", at+5_000, 3, 12, at+5_100, at+5_550), 101)
				step()
				s.fpm(0, at+14_000, at+14_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(0), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"stale@1", fmt.Sprintf("publisher_restart@%d", 1_000_000+47*100+14_000), fmt.Sprintf("stale@%d", 1_000_000+47*100+14_000)},
		},
		// Redundant bridges that could not agree on a restarted run: one, started a moment before the
		// other's first copy of it, stored the run's 50-53 under an epoch of its own (placed after the
		// other's: its run had not ended), read after the other's 56-117. They were received before the
		// run's first copy and long before its last: no later run, but the run's own first numbers.
		"another bridge's copy of numbers below the run's first, received just before it": {
			play: func(s *script, step func()) {
				at := s.run(0, 199, 1, t0)
				s.run(56, 117, 2, at+3_000)
				step()
				for q := uint64(50); q <= 53; q++ {
					s.fpmFrom("c", q, 3, at+3_000-300+int64(q-50)*50)
				}
				s.run(119, 130, 4, at+3_000+6_300) // the first bridge started again: no run start
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(56-4), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"publisher_restart@2:0-55", "zmq_drop@4:118-118"},
		},
		// The same with the marker under the run's own epoch: the bridge dropped the run's last numbers
		// at its stop (a full store) and, started again, received a later run's numbers from below the
		// marker's last.
		"a bridge's first run below where its own drop marker under the run's epoch shows the run got": {
			play: func(s *script, step func()) {
				at := s.run(2, 29, 1, t0)
				s.marker(1, 30, 70, "shutdown")
				step()
				s.run(62, 80, 3, at+45_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(41), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(62), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"stale@1", "bridge_drop@1:30-70", "stale@3", "late_start@1:0-1", "publisher_restart@3:0-61"},
		},
		// Redundant bridges that could not agree on a restarted run: one received its first numbers and
		// stalled (its process stopped), so the other, started meanwhile, recorded the run from 53; the
		// first stores its copies of 0-52, under an older epoch of its own, only after the other's. Its
		// first copy is where the run's pace, carried back from 53, puts it: the run's own first numbers.
		"a stalled bridge's copies of a run's first numbers, stored after the run another bridge recorded": {
			play: func(s *script, step func()) {
				at := s.run(0, 130, 1, t0)
				begin := at + 2_000 // the run's 0, at the stalled bridge
				for q := uint64(53); q <= 94; q++ {
					s.fpmFrom("c", q, 3, begin+int64(q)*100)
				}
				for q := uint64(0); q <= 52; q++ {
					recv := begin + int64(q)*100
					if q > 10 {
						recv = begin + 6_000 + int64(q) // read in a burst once the process ran again
					}
					s.fpm(q, 2, recv)
				}
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(0), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"stale@1", "stale@3", "publisher_restart@3"},
		},
		// The same marker read only after the grace, the jump classified: it was spooled by the bridge
		// that stopped and published when that bridge started again, long after. The new run's numbers
		// up to the old run's last, taken for the old run's, are named then under the marker's epoch.
		"a restart a drop marker read late shows": {
			play: func(s *script, step func()) {
				at := s.run(0, 39, 1, t0)
				step()
				s.run(60, 70, 3, at+3_000)
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.marker(2, 0, 9, "shutdown")
				s.tr.expire(s.nowMs + 20_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(20), s.st.Counters.Missing.ZMQDrop)
				equal(s.t, uint64(10), s.st.Counters.Missing.BridgeDrop)
				equal(s.t, uint64(30), s.st.Counters.Missing.PublisherRestart)
				equal(s.t, 0, len(s.st.Crossings))
			},
			want: []string{"zmq_drop@3:40-59", "bridge_drop@2:0-9", "publisher_restart@2:10-39"},
		},
		// Another bridge's marker from 0 shows the restart too when it received the run's 0 after the
		// last FPM seen was received; one received before it does not (see the next case).
		"a restart another bridge's drop marker read late shows": {
			play: func(s *script, step func()) {
				at := s.run(0, 39, 1, t0)
				step()
				s.run(60, 70, 3, at+3_000)
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.tr.addMarker(streams.DropMarker{Type: streams.DropMarkerEvent, Key: tkey, Epoch: 2, FirstSeq: 0, LastSeq: 9,
					Count: 10, Reason: "shutdown", Bridge: "other", FirstReceivedAtMs: at + 1_000, LastReceivedAtMs: at + 1_900}, 100)
				s.tr.expire(s.nowMs + 20_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
			},
			want: []string{"zmq_drop@3:40-59", "bridge_drop@2:0-9", "publisher_restart@2:10-39"},
		},
		// A redundant bridge started while a run went on and, held by an outage, stored its copies of
		// the run's last numbers (under its own epoch, a bridge's first run) only after the next run
		// began: they go on with the ended run, and the numbers between the run's last one seen and
		// them, which no bridge stored, are a gap of that run.
		"a restarted bridge's copies of an ended run's tail, stored after the next run began": {
			play: func(s *script, step func()) {
				at := s.run(0, 20, 1, t0)
				s.run(0, 5, 3, at+2_000) // the next run (its sequence back)
				step()
				s.run(30, 35, 2, at+500) // late, under an epoch between: the first run going on
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(9), s.st.Counters.Missing.ZMQDrop)
			},
			want: []string{"publisher_restart@3", "zmq_drop@2:21-29"},
		},
		// Redundant bridges that could not agree on a run: the one whose copy was read first missed the
		// run's first 30 numbers; the other, stopped while its runs were held, stored the first 13 under
		// an epoch of its own, received well before the first copy's 30. Its copies fill the run's first
		// numbers; they begin no run of their own.
		"another bridge's copy of the run's first numbers under a newer epoch": {
			play: func(s *script, step func()) {
				at := s.run(0, 50, 1, t0)
				s.run(30, 61, 3, at+4_000) // a restart: the sequence back, 0-29 held
				step()
				s.run(0, 12, 4, at+1_000) // 0 received as the run's 30 was 3 s later, 100 ms a number
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(17), s.st.Counters.Missing.PublisherRestart)
			},
			want: []string{"publisher_restart@3:13-29"},
		},
		// A bridge started while the other's copies were held up (a full disk, a stopped process) for
		// longer than it looked for them records the run anew: its copies of numbers the run has,
		// received well before the run's last, come under a newer epoch with no run start. They are
		// the run's numbers, and its copies past the run's last go on with it; the other bridge's copies
		// that follow fill the numbers they skipped.
		"a late-started bridge's own epoch for numbers the run has, received before its last": {
			play: func(s *script, step func()) {
				at := s.run(0, 50, 1, t0)  // the run, to 50 received at t0+5000
				s.run(30, 55, 2, t0+3_000) // the other bridge's copies from 30, received 2 s before 50
				s.fpm(51, 1, at)           // this bridge's copies past the other's
				s.run(56, 60, 1, at+500)   // and on
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(0), s.st.Counters.Restarts)
				equal(s.t, uint64(0), s.st.Counters.Missing.Total())
			},
		},
		// A restart one bridge recorded from 0 whose copies it stored late (held up by a full disk, then
		// stopped), after those of a bridge that started meanwhile and recorded the run anew from 30: the
		// late copy of 30, received with the run's first, shows the older epoch is the run's, and its
		// copies of 0-29 fill the restart's gap; its copies past the run's last go on with it.
		"a restart's first numbers stored late under an older epoch of the run": {
			play: func(s *script, step func()) {
				s.run(0, 50, 1, t0)        // the old run, to t0+5000
				s.run(30, 35, 3, t0+8_000) // the run as the started bridge stored it: the sequence back
				step()
				s.run(0, 40, 2, t0+5_000) // the other bridge's copies: 30 received at t0+8000 too
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(0), s.st.Counters.Missing.Total())
				equal(s.t, uint64(40), s.st.Last.Seq)
			},
			want: []string{"publisher_restart@3"},
		},
		// Two publisher runs stored late by a bridge that was held up, after the FPMs of a bridge started
		// meanwhile (read as the first run going on): each is placed among the run's epochs. The first
		// was received after all of the epoch before it, at a number that epoch had reached; the second
		// (seen as a restart) after the first's first message with a lower number, though before its
		// last, which that bridge's reader received late, after a stall. Each run's first numbers, which
		// no bridge stored, are named under its epoch.
		"runs stored late by a held-up bridge, after a later epoch's FPMs": {
			play: func(s *script, step func()) {
				s.run(0, 69, 1, t0)
				s.run(97, 100, 4, t0+30_000) // the bridge started meanwhile: no run start
				step()
				s.run(11, 39, 2, t0+10_000)
				s.fpm(40, 2, t0+25_000) // received after a stall
				s.runStart = map[int64]string{3: streams.RunStartRestart}
				s.run(3, 20, 3, t0+20_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Restarts)
			},
			want: []string{"stale@1", "stale@4", "stale@4:70-96", "publisher_restart@2:0-10", "publisher_restart@3:0-2"},
		},
		// Both bridges' epochs of one run reached the stream only after the next run's FPMs: one bridge
		// stored 3-45 under its first epoch, the other (which saw the restart) 46 under its own. The
		// later epoch's placed start is joined by the older one's copies, which lead up to it: the run's
		// first numbers, 0-2, are named once, under it.
		"both epochs of a run stored late, before the current run's": {
			play: func(s *script, step func()) {
				s.run(0, 60, 1, t0)
				s.run(0, 59, 5, t0+20_000) // the next run: a restart
				step()
				s.runStart = map[int64]string{4: streams.RunStartRestart}
				s.fpm(46, 4, t0+18_000)
				s.run(3, 45, 3, t0+13_750) // 45 received at t0+17950
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Restarts)
				equal(s.t, uint64(3), s.st.Counters.Missing.Total())
			},
			want: []string{"stale@1", "publisher_restart@5", "stale@5", "publisher_restart@4:0-2"},
		},
		// The same run, its later epoch's first FPM read live (a restart) before the next run began, the
		// older epoch's copies, which lead up to it, stored after the next run's: they fill its restart's gap.
		"a run's older epoch stored after the next run, leading up to its read restart": {
			play: func(s *script, step func()) {
				s.run(0, 60, 1, t0)
				s.runStart = map[int64]string{4: streams.RunStartRestart}
				s.fpm(46, 4, t0+18_000)
				s.run(0, 59, 5, t0+20_000)
				step()
				s.run(0, 45, 3, t0+13_500) // 45 received at t0+18000
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Restarts)
				equal(s.t, uint64(0), s.st.Counters.Missing.Total())
			},
			want: []string{"stale@1", "stale@4", "publisher_restart@5", "publisher_restart@4"},
		},
		// A redundant bridge's own epoch for numbers of the next run, placed before it and stored late,
		// received when that run had them: the next run's copies, no run of their own.
		"a lagging bridge's own epoch for the next run's numbers, placed before it": {
			play: func(s *script, step func()) {
				s.run(0, 60, 1, t0)
				s.run(0, 59, 5, t0+20_000)
				step()
				s.run(10, 20, 4, t0+21_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
			},
			want: []string{"stale@1", "publisher_restart@5", "stale@5"},
		},
		// A redundant bridge's own epoch for numbers of the run, received with them and stored late,
		// begins no run.
		"a lagging bridge's own epoch for the run's numbers, stored late": {
			play: func(s *script, step func()) {
				s.run(0, 69, 1, t0)
				s.run(70, 80, 3, t0+7_000) // the run goes on across a restarted bridge
				step()
				s.run(30, 60, 2, t0+3_000+40)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(0), s.st.Counters.Restarts)
			},
		},
		// The same, but the late bridge's copies stop at the number just before the other's first,
		// received just before it: they go on into the run.
		"a restart's first numbers stored late under an older epoch, up to the run's first": {
			play: func(s *script, step func()) {
				s.run(0, 50, 1, t0)
				s.run(30, 35, 3, t0+8_000)
				step()
				s.run(0, 29, 2, t0+5_000) // 29 received at t0+7900, just before the run's 30
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(1), s.st.Counters.Restarts)
				equal(s.t, uint64(0), s.st.Counters.Missing.Total())
			},
			want: []string{"publisher_restart@3"},
		},
		// The late-started bridge's copies fill a jump of the run held as a gap too (the run went on
		// across a restarted bridge's epoch).
		"a late-started bridge's own epoch for numbers of a jump of the run": {
			play: func(s *script, step func()) {
				s.run(0, 22, 1, t0)
				s.run(118, 167, 2, t0+12_000) // a restarted bridge: the run goes on, 23-117 held
				step()
				s.run(75, 105, 3, t0+7_000) // the other bridge's copies, received 5 s before the run's last
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(0), s.st.Counters.Restarts)
				equal(s.t, uint64(52+12), s.st.Counters.Missing.Total())
			},
			want: []string{"stale@1", "stale@2", "stale@2:23-74", "stale@2:106-117"},
		},
		// The same numbers under a newer epoch received after the run's last are a restart; so are
		// they from a bridge that saw the sequence go back, however early it received them (the run's
		// last here came late from a bridge whose reader had stalled).
		"a restart's numbers the run has, received after its last, or seen as a restart": {
			play: func(s *script, step func()) {
				at := s.run(0, 50, 1, t0)
				at = s.run(30, 35, 2, at+1_000)
				step()
				s.runStart = map[int64]string{3: streams.RunStartRestart}
				s.run(31, 33, 3, at-700)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(2), s.st.Counters.Restarts)
			},
			want: []string{"publisher_restart@2:0-29", "publisher_restart@3:0-30"},
		},
		// A marker from seq 0 under a newer epoch of another bridge, or one of the same bridge that goes
		// on past the last number seen, shows no restart: the next FPM goes on with the run. (The same
		// bridge started again receives only numbers sent after it subscribed: above the marker's.)
		"a drop marker of another bridge or mid-run shows no restart": {
			play: func(s *script, step func()) {
				at := s.run(0, 39, 1, t0)
				s.tr.addMarker(streams.DropMarker{Type: streams.DropMarkerEvent, Key: tkey, Epoch: 2, FirstSeq: 0, LastSeq: 9,
					Count: 10, Reason: "shutdown", Bridge: "other"}, 100)
				s.marker(2, 42, 43, "shutdown")
				step()
				s.run(45, 49, 3, at+3_000)
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(0), s.st.Counters.Restarts)
			},
			want: []string{"zmq_drop@3:40-41", "bridge_drop@3:42-43", "zmq_drop@3:44-44"},
		},
		// A gap across a bridge restart is named under both epochs; a late copy takes its number back
		// once, whichever epoch it came under.
		"a number named across two epochs is taken back once": {
			play: func(s *script, step func()) {
				at := s.run(0, 9, 1, t0)
				s.run(13, 20, 2, at+300) // a restarted bridge: 10-12 named under epochs 1 and 2
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.fpm(11, 1, at+100)
				s.fpm(11, 2, at+100)
				s.tr.flushRecovered()
				equal(s.t, uint64(2), s.st.Counters.Missing.ZMQDrop)
				equal(s.t, uint64(1), s.st.Counters.Recovered)
				equal(s.t, uint64(1), s.st.Counters.Duplicates)
			},
			want: []string{"zmq_drop@2:10-12", "recovered zmq_drop@1:11-11"},
		},
		// A redundant bridge joined a new run late and recorded it first (its first number 55, the run
		// begun by a restart); the grace passed before the other bridge, held up by a full disk, stored
		// its copies of the run's first numbers under the same epoch. They are messages, and the
		// restart's missing numbers are taken back in one recovered event.
		"a restart's first numbers stored after its event by the bridge that lagged": {
			play: func(s *script, step func()) {
				at := s.run(0, 115, 1, t0)
				s.runStart = map[int64]string{2: streams.RunStartRestart}
				s.run(55, 80, 2, at+3_000) // bridge B, from where it joined
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.run(0, 54, 2, at+100) // bridge A's copies, stored after the restart event
				s.run(81, 90, 2, at+5_600)
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(116+91), s.st.Counters.Messages)
				equal(s.t, uint64(0), s.st.Counters.Duplicates)
				equal(s.t, uint64(55), s.st.Counters.Recovered)
				equal(s.t, uint64(0), s.st.Counters.Missing.Total())
			},
			want: []string{"publisher_restart@2:0-54", "recovered publisher_restart@2:0-54"},
		},
		// A bridge that stalled (full disk, paused) stores the last FPMs it received of a run after the
		// next run's first ones: the stream holds each once, so each is a message, none a duplicate.
		"an ended run's last numbers stored after the next run began are messages": {
			play: func(s *script, step func()) {
				at := s.run(0, 18, 1, t0)
				s.fpm(1, 2, at+1_000) // the restart, then a copy of its seq 0 from the other bridge
				s.fpm(0, 2, at+950)
				after := s.run(2, 35, 2, at+1_050)
				step()
				s.run(19, 32, 1, at) // the old run's tail, received before the restart, stored now
				step()
				s.run(36, 40, 2, after)
				s.run(30, 32, 1, at) // a copy of numbers seen under their epoch: duplicates
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(19+36+14+5), s.st.Counters.Messages)
				equal(s.t, uint64(3), s.st.Counters.Duplicates)
			},
			want: []string{"publisher_restart@2"},
		},
		"a hole in an ended run's tail stored late is a gap of that run": {
			play: func(s *script, step func()) {
				at := s.run(0, 18, 1, t0)
				s.run(0, 5, 2, at+1_000)
				step()
				s.run(21, 22, 1, at+200)
				step()
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(19+6+2), s.st.Counters.Messages)
			},
			want: []string{"publisher_restart@2", "zmq_drop@1:19-20"},
		},
		// Redundant bridges that could not agree on a run's epoch each store their own copy of it. Here
		// the bridge with the older epoch stalled and stored its copy, out of order, after the other's
		// and after the grace of the restart it revealed: every FPM of its copy is stored once under
		// its epoch, a message, and the numbers the restart named missing are taken back (its epoch is
		// within sameRunTolerance of the other's: the same run).
		"a redundant bridge's own copy of a run under an older epoch, stored late and out of order": {
			play: func(s *script, step func()) {
				at := s.run(0, 76, 1, t0)     // the run before (epoch 1)
				s.run(30, 133, 3, at+1_500)   // bridge B's copy of the new run: it saw it from seq 30
				s.tr.expire(s.nowMs + 10_000) // the restart's first numbers are named before A's copy comes
				step()
				s.run(239, 298, 2, at+12_000) // bridge A's copy, epoch 2: its newest held FPMs first,
				s.fpm(77, 1, at)              // the old run's last one,
				s.run(0, 238, 2, at+100)      // then the ones it held longer,
				s.run(299, 302, 2, at+15_000) // then the rest
				step()
				s.fpm(240, 2, at+12_050) // and a copy of one already stored under its epoch
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(78+104+303), s.st.Counters.Messages)
				equal(s.t, uint64(1), s.st.Counters.Duplicates)
			},
			want: []string{"publisher_restart@3:0-29", "recovered publisher_restart@2:0-29"},
		},
		// Two bridges received a replay about together and could not agree on it: one's first was 4
		// (a late_start names 0-3 under its epoch), the other's 0, 101 ms earlier, under an epoch of
		// its own, stored after the event: the same run's 0, taken back.
		"another bridge's copy of a late start's number, under its own epoch of the run, stored after the event": {
			play: func(s *script, step func()) {
				e1 := int64(t0 + 101)
				s.run(4, 20, e1, e1)
				s.tr.expire(s.nowMs + 10_000)
				step()
				s.fpm(0, t0, t0)
				s.tr.flushRecovered() // as the detector's clock does
				equal(s.t, uint64(3), s.st.Counters.Missing.LateStart)
				equal(s.t, uint64(18), s.st.Counters.Messages)
			},
			want: []string{"late_start@1000101:0-3", "recovered late_start@1000000:0-0"},
		},
		// Bridge B, started while a new run was live, takes it for the run before going on (no
		// Fpm-Run-Start); bridge A, stalled, stores the old run's copies under the old epoch after B's
		// first one, then the new run's under B's epoch. A number seen under one epoch is not a
		// duplicate of the same number under the other: the stream holds both.
		"two bridges' epochs interleaved in what reads as one run: each epoch's numbers counted once": {
			play: func(s *script, step func()) {
				at := s.run(0, 16, 1, t0) // bridge A, the old run
				s.fpm(30, 3, at+1_300)    // bridge B's first: the run going on, 17-29 pending
				step()
				s.run(17, 40, 1, at) // bridge A's late copies of the old run: fill 17-29, then go on
				step()
				s.run(31, 45, 3, at+1_400) // bridge B goes on under its epoch
				s.run(0, 29, 3, at+100)    // bridge A's copies of the new run, under the epoch it adopted
				step()
				s.fpm(35, 3, at+1_800) // a copy of one stored under its epoch already
				s.tr.expire(s.nowMs + 10_000)
				equal(s.t, uint64(17+1+24+15+30), s.st.Counters.Messages)
				equal(s.t, uint64(1), s.st.Counters.Duplicates)
				equal(s.t, uint64(13), s.st.Counters.OutOfOrder)
			},
		},
	}
	for name, tc := range tests {
		for _, reload := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/reload=%v", name, reload), func(t *testing.T) {
				s := newScript(t)
				step := func() {
					if reload {
						s.reload()
					}
				}
				tc.play(s, step)
				equal(t, tc.want, epochSummary(s.events()))
				check(t, len(s.st.Pending) == 0, "pending %+v", s.st.Pending)
			})
		}
	}
}

// TestTrackerLateStartEvidence: a late_start event carries the first number the bridge received and
// the run's epoch (the bridge's first receive of the run: subscribed by then), nothing before it.
func TestTrackerLateStartEvidence(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		firstAtMs int64 // observed time of the first message seen; its epoch is 1_782_777_600_000
		note      bool  // the summary says the bridge received earlier messages of the run
	}{
		"the first message seen is the bridge's first of the run":       {firstAtMs: 1_782_777_600_000},
		"the bridge received messages of the run before the first seen": {firstAtMs: 1_782_777_660_000, note: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			const epoch = 1_782_777_600_000
			s := newScript(t)
			s.run(1310, 1400, epoch, tc.firstAtMs)
			s.tr.expire(s.nowMs + 10_000)
			ev := s.events()
			equal(t, 1, len(ev))
			e := ev[0]
			equal(t, "gap:dynamo.backend.w1.0:1782777600000:0-1309", e.ID)
			equal(t, CauseLateStart, e.Cause)
			equal(t, uint64(1310), e.Missing)
			check(t, e.Before == nil, "before %+v", e.Before)
			check(t, e.After != nil && e.After.Seq == 1310 && e.After.ObservedAtMs == tc.firstAtMs && e.After.Epoch == epoch, "after %+v", e.After)
			check(t, e.Evidence.FirstSeenSeq != nil && *e.Evidence.FirstSeenSeq == 1310, "first_seen_seq %v", e.Evidence.FirstSeenSeq)
			equal(t, int64(epoch), e.Evidence.SubscribedByMs)
			equal(t, int64(10_000), e.Evidence.MarkerGraceMs)
			check(t, !e.Evidence.EpochChanged && !e.Evidence.BridgeChanged, "evidence %+v", e.Evidence)
			check(t, strings.Contains(e.Evidence.Summary, "does not report when it connected"), "summary %q", e.Evidence.Summary)
			equal(t, tc.note, strings.Contains(e.Evidence.Summary, "received earlier messages of the run"), "summary: ", e.Evidence.Summary)
			equal(t, CauseCounts{LateStart: 1}, s.st.Counters.Gaps)
			equal(t, CauseCounts{LateStart: 1310}, s.st.Counters.Missing)
		})
	}
}
