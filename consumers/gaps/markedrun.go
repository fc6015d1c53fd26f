package gaps

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/fpmbus/fpmbus/streams"
)

// Runs of which only drop markers were stored. A publisher restarted while its bridges could store
// nothing (the store refused writes, and the bridges were stopped before it took them again, spooling
// their markers), and restarted or stopped again: the stream holds no FPM of the run, only a marker
// of what one bridge received of it and dropped. The marker names its own numbers (the report counts
// them, unrevealed.go). The numbers before its first, when the run began as a restart (run_start:
// the bridge's sequence went back) and the marker's first is the first message the bridge received
// under the run's epoch, never reached that bridge: sent before it was subscribed again to the new
// publisher process. A run with FPMs has them named by its restart event; this run has none to reveal
// them, so the detector names them from the markers, once per run, under the epoch of the bridge that
// received the run first:
//   - when the first FPM of a later run arrives with the markers held (markedRuns): the later run's
//     first number is not past the markers' last and was received well after it (a bridge receives a
//     publisher's numbers in order: it cannot be the markers' run going on);
//   - when a marker arrives after that FPM (markedRunLate), by the same test against the first FPM
//     received under the first epoch seen after the marker's.
//
// Markers of redundant bridges whose epochs are within sameRunTolerance of each other (both received
// the run's first message about together) are one run, named from the lowest first number among
// them; a bridge that joined the run later gives it an epoch further off and is not grouped (its
// numbers below its own first may then be named under both). Copies of such a run stored after the next
// run began, under another bridge's epoch (a bridge that lagged by more than a run and the marker
// grace), are counted as that epoch's messages while the numbers stay named: the limit every late copy
// under an epoch of its own has (recover takes back only numbers named under the copy's epoch).

// markedRuns names the first numbers of the runs seen only by held drop markers between the last FPM
// and o, the first FPM of a run after them.
func (t *tracker) markedRuns(o *fpmObservation) {
	st := t.st
	var ms []*heldMarker
	for i := range st.Markers {
		m := &st.Markers[i]
		if !m.Used && m.RunStart == streams.RunStartRestart && m.Epoch > st.MaxEpoch && m.Epoch < o.Epoch &&
			m.FirstReceivedAtMs > st.Last.ObservedAtMs && after(o.point(), m) {
			ms = append(ms, m)
		}
	}
	before := st.Last
	t.nameMarkedRuns(ms, &before)
}

// markedRunLate is markedRuns for marker m applied after the first FPM of the run that followed its
// own: under an epoch nothing was counted in, after one that was, and before the first FPM of the
// next epoch seen, whose number is below m's first and which was received after m's last. The held
// markers of the same run (near m's epoch) are named with it.
func (t *tracker) markedRunLate(m *heldMarker) {
	st := t.st
	if !st.Started || m.Used || m.RunStart != streams.RunStartRestart || m.Epoch >= st.MaxEpoch {
		return
	}
	i, found := slices.BinarySearchFunc(st.Epochs, m.Epoch, func(e epochSeen, epoch int64) int { return cmp.Compare(e.Epoch, epoch) })
	if found || i == 0 || i == len(st.Epochs) {
		return // an epoch counted in, or nothing seen before (or after) it
	}
	prev, next := &st.Epochs[i-1], &st.Epochs[i]
	if prev.LastAtMs >= m.FirstReceivedAtMs || next.First == nil || !after(*next.First, m) {
		return
	}
	var ms []*heldMarker
	for j := range st.Markers {
		h := &st.Markers[j]
		if !h.Used && h.RunStart == streams.RunStartRestart && h.Epoch > prev.Epoch && h.Epoch < next.Epoch &&
			h.Epoch >= m.Epoch-sameRunTolerance && h.Epoch <= m.Epoch+sameRunTolerance {
			ms = append(ms, h)
		}
	}
	t.nameMarkedRuns(ms, nil)
}

// after reports whether p, an FPM, belongs to a run after marker m's: its number is not past the
// marker's last (the numbers went back) and it was received more than sameRunTolerance after it (no
// bridge lags that far behind another on one run and numbers it as this one).
func after(p point, m *heldMarker) bool {
	return p.Seq <= m.LastSeq && p.ObservedAtMs > m.LastReceivedAtMs+sameRunTolerance
}

// nameMarkedRuns groups markers ms into runs (epochs within sameRunTolerance of the run's first) and
// emits, for each run not named or counted in yet, a publisher_restart event naming its numbers below
// the lowest first number of its markers, when that marker's first is the first message its bridge
// received under its epoch. before is the last FPM of the run the restart ended, nil when unknown
// (a marker applied late).
func (t *tracker) nameMarkedRuns(ms []*heldMarker, before *point) {
	slices.SortFunc(ms, func(a, b *heldMarker) int { return cmp.Compare(a.Epoch, b.Epoch) })
	for len(ms) > 0 {
		n := 1
		for n < len(ms) && ms[n].Epoch <= ms[0].Epoch+sameRunTolerance {
			n++
		}
		t.nameMarkedRun(ms[:n], before)
		ms = ms[n:]
	}
}

// nameMarkedRun names the first numbers of the run markers ms (one run, sorted by epoch) saw.
func (t *tracker) nameMarkedRun(ms []*heldMarker, before *point) {
	st := t.st
	for i := range st.Epochs {
		if e := st.Epochs[i].Epoch; e >= ms[0].Epoch-sameRunTolerance && e <= ms[len(ms)-1].Epoch+sameRunTolerance {
			return // named already, or FPMs of the run were counted: their restart names its start
		}
	}
	low := ms[0]
	for _, m := range ms[1:] {
		if m.FirstSeq < low.FirstSeq {
			low = m
		}
	}
	if low.FirstSeq == 0 || low.FirstReceivedAtMs != low.Epoch {
		return // nothing below, or the bridge received earlier numbers of the run it did not drop
	}
	epoch, first := ms[0].Epoch, low.FirstSeq
	after := point{Seq: first, ObservedAtMs: low.FirstReceivedAtMs, Epoch: low.Epoch, Bridge: low.Bridge}
	ev := evidence{NewRunFirstSeq: u64p(first), Markers: []citedMarker{markerRef(&low.DropMarker)}}
	if before != nil {
		ev.EpochChanged, ev.BridgeChanged = before.Epoch != epoch, before.Bridge != low.Bridge
	}
	ev.Summary = fmt.Sprintf("a drop marker is all that was stored of this publisher run: bridge %s saw the publisher restart, received seq %d first (its epoch %d) and dropped seq %d-%d (%s); the %d numbers before it were sent before the bridge was subscribed to the new publisher process, and no bridge stored any",
		low.Bridge, first, low.Epoch, low.FirstSeq, low.LastSeq, low.Reason, first)
	t.seen(epoch, 0, first-1)
	id := streams.RestartMsgID(t.key, epoch)
	t.named(&pending{After: point{Epoch: epoch}, EpochLo: epoch, EpochHi: epoch}, namedRange{Lo: 0, Hi: first - 1, Cause: CausePublisherRestart, Gap: id})
	st.Counters.Restarts++
	t.emit(&Event{GapEventFields: streams.GapEventFields{Type: TypeGap, ID: id, Cause: CausePublisherRestart, Epoch: epoch,
		FirstMissing: u64p(0), LastMissing: u64p(first - 1), Missing: first, Before: before}, After: &after, Evidence: ev})
}
