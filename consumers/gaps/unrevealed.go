package gaps

import (
	"math"
	"slices"

	"github.com/fpmbus/fpmbus/streams"
)

// Drops no gap event names. A gap event names only numbers below one the detector saw after them (the
// FPM that revealed the gap). The numbers a bridge drop marker names after the last one seen of their
// run are revealed by nothing once that run has ended: the publisher stopped, or restarted, while the
// bridge was dropping (a full store disk, an outage longer than the buffer, a stop that ran out of
// time). The report counts them from the markers themselves (dropUnrevealed): dropped, named by the
// bridge, and missing from every gap event. They are disjoint from the gap events' numbers by
// construction: only numbers above the last one seen of their run are counted, and the moment a later
// FPM of the run reveals them they fall below it, into the gap event that names them.
//
// A marker's run is found by its epoch: the publisher's current run (state.Run, up to state.MaxEpoch),
// a run a restart ended (the old_run of a publisher_restart event, gone further if its last FPMs
// were stored after the next run began: state.Epochs' RunLast), or no run the detector saw any FPM
// of (every number of it dropped; counted whole). A marker older than every run the detector knows
// predates it and is left out (the first run's numbers before its first FPM are a late_start gap).
// Overlapping markers (redundant bridges dropping the same numbers) count once.

// endedRun is how far a run got, from its publisher_restart event, and when the run after it began
// (the event's epoch: its first message's receive time; 0 when not known).
type endedRun struct {
	firstEpoch, lastEpoch int64
	lastSeq               uint64
	nextBeganMs           int64
}

// lateRunLast is how far run r got with its numbers stored after the next run began (state.Epochs'
// RunLast: the event's old_run says how far it had got when it ended), 0 if no further.
func lateRunLast(st *state, r endedRun) uint64 {
	var last uint64
	if st == nil {
		return 0
	}
	for _, e := range st.Epochs {
		if e.RunLast != nil && e.Epoch >= r.firstEpoch && e.Epoch <= r.lastEpoch && e.RunLast.Seq < math.MaxUint64 {
			last = max(last, e.RunLast.Seq)
		}
	}
	return last
}

// runLastAt is where a run a restart ended got to under epoch (state.Epochs' RunLast), when it did.
func runLastAt(st *state, epoch int64) (uint64, bool) {
	if st == nil {
		return 0, false
	}
	for _, e := range st.Epochs {
		if e.Epoch == epoch && e.RunLast != nil && e.RunLast.Seq < math.MaxUint64 {
			return e.RunLast.Seq, true
		}
	}
	return 0, false
}

// sameRunTolerance is how far apart two bridges' epochs of one publisher run may be: each is its
// bridge's receive time of the run's first message (the bridge's own evidenceTolerance).
const sameRunTolerance = 500

// minusSeenNear returns lo..hi of marker m's run without the numbers st counted or named under
// another bridge's epoch of the same run: one within sameRunTolerance of m's epoch (both bridges
// received the run's first message), or one that began while m's bridge was receiving the run, up to
// m's last number (the other bridge joined the run later, its epoch its receive time of a later number;
// runs of one publisher do not overlap in time), or one whose messages were received from before m's
// first to after it, of a run not ended before m's first (the other bridge was in the run all along and
// m's bridge, starting, recorded it anew: redundant bridges that could not agree on it). A run a restart
// ended before m's bridge received m's first is another run, whatever a stalled bridge received of it
// later.
func minusSeenNear(st *state, m streams.DropMarker, lo, hi uint64, ended []endedRun) [][2]uint64 {
	out := [][2]uint64{{lo, hi}}
	if st == nil {
		return out
	}
	for _, e := range st.Epochs {
		near := e.Epoch >= m.Epoch-sameRunTolerance && e.Epoch <= m.Epoch+sameRunTolerance
		during := e.Epoch > m.Epoch && e.Epoch <= m.LastReceivedAtMs
		across := m.FirstReceivedAtMs > 0 && e.Epoch < m.Epoch && e.First != nil &&
			e.First.ObservedAtMs <= m.FirstReceivedAtMs && e.LastAtMs >= m.FirstReceivedAtMs && !endedBefore(ended, e.Epoch, m.FirstReceivedAtMs)
		if e.Epoch == m.Epoch || !near && !during && !across {
			continue
		}
		out = minusRanges(out, e.Seen)
	}
	return out
}

// endedBefore reports whether a restart ended the run epoch belongs to before atMs: the run after it
// began by then.
func endedBefore(ended []endedRun, epoch, atMs int64) bool {
	for _, r := range ended {
		if epoch >= r.firstEpoch && epoch <= r.lastEpoch && r.nextBeganMs > 0 && r.nextBeganMs <= atMs {
			return true
		}
	}
	return false
}

// minusRanges returns the numbers of ranges rs not in ranges seen.
func minusRanges(rs, seen [][2]uint64) [][2]uint64 {
	for _, s := range seen {
		var next [][2]uint64
		for _, r := range rs {
			if s[1] < r[0] || s[0] > r[1] {
				next = append(next, r)
				continue
			}
			if s[0] > r[0] {
				next = append(next, [2]uint64{r[0], s[0] - 1})
			}
			if s[1] < r[1] {
				next = append(next, [2]uint64{s[1] + 1, r[1]})
			}
		}
		rs = next
	}
	return rs
}

// dropUnrevealed returns how many numbers the markers of one publisher name that no gap event names
// (see above); st is the detector's state of the publisher, nil when it never saw an FPM of it.
func dropUnrevealed(markers []streams.DropMarker, st *state, ended []endedRun) uint64 {
	type runKey struct {
		epoch int64 // the run's first epoch (the marker's own for a run never seen)
		seen  bool
	}
	above := map[runKey][][2]uint64{}
	oldest := int64(-1) // the first epoch of the oldest run known
	if st != nil && st.Started {
		oldest = st.Run.FirstEpoch
	}
	for _, r := range ended {
		if oldest < 0 || r.firstEpoch < oldest {
			oldest = r.firstEpoch
		}
	}
	for _, m := range markers {
		if m.LastSeq < m.FirstSeq {
			continue
		}
		first := m.FirstSeq
		var rk runKey
		switch {
		case st != nil && st.Started && m.Epoch >= st.Run.FirstEpoch && m.Epoch <= st.MaxEpoch:
			rk = runKey{st.Run.FirstEpoch, true}
			if st.Last.Seq == math.MaxUint64 {
				continue
			}
			first = max(first, st.Last.Seq+1)
		case st != nil && st.Started && m.Epoch > st.MaxEpoch:
			rk = runKey{m.Epoch, false} // a run (or a bridge's epoch) of which nothing was stored yet
		default:
			i := slices.IndexFunc(ended, func(r endedRun) bool { return m.Epoch >= r.firstEpoch && m.Epoch <= r.lastEpoch })
			switch {
			case i >= 0:
				if ended[i].lastSeq == math.MaxUint64 {
					continue
				}
				rk = runKey{ended[i].firstEpoch, true}
				first = max(first, ended[i].lastSeq+1, lateRunLast(st, ended[i])+1)
			case oldest >= 0 && m.Epoch < oldest:
				continue // before anything the detector saw
			default:
				rk = runKey{m.Epoch, false}
				if last, ok := runLastAt(st, m.Epoch); ok {
					first = max(first, last+1) // a restart's run went on to it: the gap event names it
				}
			}
		}
		if first > m.LastSeq {
			continue
		}
		if rk.seen {
			above[rk] = append(above[rk], [2]uint64{first, m.LastSeq})
			continue
		}
		// A run the detector saw no FPM of under the marker's epoch may be one another bridge stored under
		// its own epoch (redundant bridges that could not agree on it): its numbers stored there are not
		// missing.
		above[rk] = append(above[rk], minusSeenNear(st, m, first, m.LastSeq, ended)...)
	}
	var n uint64
	for _, rs := range above {
		if len(rs) == 0 {
			continue
		}
		slices.SortFunc(rs, func(a, b [2]uint64) int {
			switch {
			case a[0] < b[0]:
				return -1
			case a[0] > b[0]:
				return 1
			}
			return 0
		})
		cur := rs[0]
		for _, r := range rs[1:] {
			if cur[1] == math.MaxUint64 || r[0] <= cur[1]+1 {
				cur[1] = max(cur[1], r[1])
				continue
			}
			n += cur[1] - cur[0] + 1
			cur = r
		}
		n += cur[1] - cur[0] + 1
	}
	return n
}
