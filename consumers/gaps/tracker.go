package gaps

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/fpmbus/fpmbus/streams"
)

// maxMarkers bounds the drop markers kept per publisher; the oldest go first.
const maxMarkers = 1024

// fpmObservation is one FPM as the tracker sees it.
type fpmObservation struct {
	// StreamSeq is the message's FPM stream sequence; StoredMs its stream timestamp (Unix ms).
	StreamSeq uint64
	StoredMs  int64
	// Seq is the publisher's sequence number (Fpm-Seq, the ZMQ sequence frame = counter_id).
	Seq uint64
	// ObservedAtMs is the bridge's receive time (Fpm-Received-At-Ms).
	ObservedAtMs int64
	// Epoch (Fpm-Epoch) and Bridge (Fpm-Bridge) say which bridge run published it.
	Epoch  int64
	Bridge string
	// Heartbeat: an idle heartbeat (wall_time 0, every count zero).
	Heartbeat bool
	// SeqMismatch: the bridge flagged counter_id != sequence frame.
	SeqMismatch bool
	// RunStart (Fpm-Run-Start) is how the bridges saw the message's run begin: streams.RunStartRestart,
	// streams.RunStartReconnect, or "" (a bridge's first run of the publisher: the run before going on).
	RunStart string
}

func (o *fpmObservation) point() point {
	return point{Seq: o.Seq, ObservedAtMs: o.ObservedAtMs, Epoch: o.Epoch, Bridge: o.Bridge}
}

// rules are the detector settings the tracker applies.
type rules struct {
	graceMs      int64
	staleAfterMs int64
}

// tracker applies one publisher's messages and drop markers, in order, to its State and appends the
// resulting events to state.Outbox. It is pure: no I/O, no clock (time comes in as arguments), so the
// same inputs in the same order give the same state and events.
//
// Sequence rules (Dynamo's publisher numbers every message, heartbeats too, from 0 per run):
//   - the first message ever seen, at seq > 0: the numbers before it were sent before the bridge
//     received anything of the run (held as Pending like a gap; late_start unless markers cover them).
//   - seq > last: the run goes on; numbers skipped in between are a gap (held as Pending until drop
//     markers cover it or the marker grace passes). A new bridge epoch here is a restarted bridge, not
//     a restarted publisher, unless the bridges say the run began with a restart or a reconnect
//     (Fpm-Run-Start): then it is a new run whose numbers before the first one received never
//     arrived, cause publisher_restart or reconnect (a reconnect is a restart the bridge could not see
//     as one: the sequence did not go back).
//   - seq <= last under an epoch newer than any of the run: the bridge saw the sequence go back, so
//     the publisher restarted; unless it was received well before the run's first number seen (being
//     below it) or, from a bridge that saw no restart, before the run's last one: another bridge's
//     copy of the run's numbers under an epoch of its own (copyOfRun), a late message.
//   - seq <= last otherwise, or any seq under an epoch older than the run's first: a late message. It
//     fills a pending gap (out of order), or it is a duplicate when its number was already counted or
//     named missing under its own epoch (state.Epochs), or else it is a message all the same: the
//     stream holds each FPM once per epoch, not in sequence order (an ended run's last FPMs stored
//     after the next run began, redundant bridges' copies under their own epochs interleaved; see
//     late). Past the last number of a run a restart ended, under its last epoch, the run goes on, and
//     the numbers it skipped are a gap of that run; so too under a bridge's first epoch between that
//     run's last and the next run's (endedRunGoesOn), as it would have read live. A first FPM of an
//     epoch below a later one, received well after all of the epoch before it at a number that
//     epoch had reached (or seen by its bridge as a run start), or after that epoch's first message
//     with a lower number, began a run of its own that a held-up bridge stored late: its first numbers
//     are that run's restart gap (placedRunBegins), which an older epoch's copies leading up to its
//     first number join (joinPlaced).
//
// Pending gaps are independent of the run: a restart starts a new one and leaves the old run's
// pending gaps (their epochs, their revealed times) to be classified like any other.
type tracker struct {
	key    streams.Key
	st     *state
	r      rules
	onEmit func(*Event) // may be nil
	// significant is set by every change beyond a message advancing the sequence by one (a gap, a
	// marker, an event, a duplicate, ...); the detector checkpoints such a state before acking.
	significant bool
}

// observe applies one FPM. The caller has checked that o.StreamSeq > st.StreamSeq.
func (t *tracker) observe(o *fpmObservation) {
	st := t.st
	st.StreamSeq = o.StreamSeq
	if !st.Started || o.Seq != st.Last.Seq+1 || o.Epoch < st.Run.FirstEpoch || st.Stale != nil ||
		o.ObservedAtMs-st.LastSeenMs > t.r.staleAfterMs {
		t.significant = true
	}
	if o.SeqMismatch {
		st.Counters.SeqMismatch++
	}
	if st.Started && !st.Redundant && o.Bridge != "" && st.Last.Bridge != "" && o.Bridge != st.Last.Bridge {
		st.Redundant = true
		t.significant = true
	}
	if !st.Started {
		st.Started = true
		st.FirstSeenMs, st.LastSeenMs = o.ObservedAtMs, o.ObservedAtMs
		t.startRun(o, false)
		t.count(o)
		if o.Seq > 0 {
			t.reveal(pending{Kind: kindStart, Ranges: [][2]uint64{{0, o.Seq - 1}}, After: o.point(), RevealedMs: o.StoredMs,
				EpochLo: o.Epoch, EpochHi: o.Epoch})
		}
		if len(st.Markers) > 0 {
			t.prune()
		}
		return
	}
	advance := o.Seq > st.Last.Seq
	if !advance && o.Epoch > st.MaxEpoch && t.copyOfRun(o) {
		t.joinRun(o.Epoch)
	}
	if o.Epoch < st.Run.FirstEpoch || !advance && o.Epoch <= st.MaxEpoch {
		// A late message: of an older run (its epoch predates the run's), or of this run.
		t.joinPlaced(o)
		switch {
		case t.fill(o):
			st.Counters.OutOfOrder++
			t.count(o)
			if o.Epoch >= st.Run.FirstEpoch && o.Seq < st.Run.FirstSeq && !st.Run.ByRestart {
				st.Run.FirstSeq = o.Seq // before the first number seen of the first run
			}
		case t.recoverNear(o):
			// Named missing by a gap event under another bridge's epoch of its run, stored after all.
		case t.late(o):
			// Neither counted nor named under its own epoch yet: a message, counted by late.
		case t.recover(o):
			// Named missing by a gap event under its epoch, stored after all: a message, taken back.
		default:
			// Seen already, or reported missing by a gap classified before it came.
			st.Counters.Duplicates++
		}
		return
	}
	silentMs := o.ObservedAtMs - st.LastSeenMs
	if st.Stale == nil && silentMs > t.r.staleAfterMs {
		t.goStale()
	}
	stale := st.Stale
	// A new epoch the bridges say began a new run: a restart whatever the sequence did.
	newRun := !advance || o.Epoch > st.MaxEpoch && (o.RunStart == streams.RunStartRestart || o.RunStart == streams.RunStartReconnect)
	// Or one only a drop marker saw begin (markedRestart).
	var markedFrom int64
	if !newRun && o.Epoch > st.MaxEpoch && o.RunStart == "" {
		markedFrom = t.markedRestart(o)
		newRun = markedFrom != 0
	}
	// Or a drop marker of o's own bridge shows the run got to or past o before (markedPast).
	past := !newRun && o.Epoch > st.MaxEpoch && o.RunStart == "" && t.markedPast(o)
	newRun = newRun || past
	if !newRun {
		if o.Epoch > st.MaxEpoch && o.RunStart == "" {
			t.cross(o)
		}
		if o.Seq > st.Last.Seq+1 {
			kind := kindJump
			if stale != nil {
				kind = kindResume
			}
			t.reveal(pending{
				Kind: kind, Ranges: [][2]uint64{{st.Last.Seq + 1, o.Seq - 1}},
				Before: st.Last, After: o.point(), RevealedMs: o.StoredMs,
				EpochLo: min(st.Last.Epoch, o.Epoch), EpochHi: max(st.Last.Epoch, o.Epoch),
				AfterStale: stale != nil, SilentMs: silentMs,
			})
		}
		st.Last = o.point()
		st.Run.LastSeq, st.Run.LastEpoch, st.Run.LastAtMs = o.Seq, o.Epoch, o.ObservedAtMs
		st.MaxEpoch = max(st.MaxEpoch, o.Epoch)
	} else {
		t.restart(o, stale != nil, silentMs, advance && o.RunStart != streams.RunStartRestart && markedFrom == 0 && !past, markedFrom)
	}
	t.count(o)
	st.LastSeenMs = max(st.LastSeenMs, o.ObservedAtMs)
	if stale != nil {
		t.resume(o, stale, newRun, advance && newRun && o.RunStart != streams.RunStartRestart && markedFrom == 0 && !past)
	}
	if len(st.Markers) > 0 {
		t.prune()
	}
}

// copyOfRun reports whether o, under an epoch newer than every one of the current run and at or below
// its last number, cannot begin a run after the current one, which would have been sent after all of
// it: o was received well before (by more than two bridges' clocks may differ) the run's first number
// was, being below it, or its last number was, o's bridge not having seen a restart (no run start: a
// bridge's first run, which it could not tell from the run going on). It is another bridge's copy of
// the current run's numbers under an epoch of its own: redundant bridges that could not agree on the
// run give it two epochs (a bridge stopped while its runs were held agrees them at its stop with what
// it has; a bridge started while the other's copies were held up, by a full disk or a stopped process,
// for longer than it looks for them records the run anew). A number below the run's first that such a
// bridge received before the run's first number and well before its last is one too: the bridge that
// joined first stored the run's earlier numbers under an epoch placed after the other's, its run not
// having ended when it recorded it.
func (t *tracker) copyOfRun(o *fpmObservation) bool {
	st := t.st
	firstRun := o.RunStart == "" && o.ObservedAtMs+sameRunTolerance < st.Run.LastAtMs
	if o.Seq < st.Run.FirstSeq {
		return o.ObservedAtMs+sameRunTolerance < st.Run.StartedAtMs || firstRun && o.ObservedAtMs < st.Run.StartedAtMs
	}
	return firstRun
}

// joinRun takes epoch, another bridge's for the current run, into the run: its copies are the run's
// late messages (they fill the run's first numbers and its jumps held as gaps), and its numbers past
// the run's last go on with the run.
func (t *tracker) joinRun(epoch int64) {
	st := t.st
	st.MaxEpoch = epoch
	t.significant = true
	for i := range st.Pending {
		// The run's first numbers held as a gap, and every gap within the run (a jump across a
		// restarted bridge's epoch): the joined epoch's copies fill them.
		if p := &st.Pending[i]; (p.Kind == kindRestart || p.Kind == kindStart) && t.beginsCurrentRun(p) ||
			p.EpochLo >= st.Run.FirstEpoch && p.After.Epoch >= st.Run.FirstEpoch {
			p.EpochHi = max(p.EpochHi, epoch)
		}
	}
}

func (t *tracker) count(o *fpmObservation) {
	t.st.Counters.Messages++
	if o.Epoch >= t.st.Run.FirstEpoch {
		t.st.Run.Messages++ // a late message of an older run is not the current run's
	}
	if o.Heartbeat {
		t.st.Counters.Heartbeats++
	}
	t.seen(o.Epoch, o.Seq, o.Seq)
	if i := t.epoch(o.Epoch, false); i >= 0 {
		e := &t.st.Epochs[i]
		e.LastAtMs = max(e.LastAtMs, o.ObservedAtMs)
		if e.First == nil || o.ObservedAtMs < e.First.ObservedAtMs {
			p := o.point()
			e.First = &p
		}
	}
}

// Bounds of state.Epochs: the epochs kept, and the ranges of numbers kept per epoch.
const (
	maxEpochs     = 32
	maxSeenRanges = 64
)

// late applies a late message (see observe) that filled no pending gap, and reports whether it is a
// message: its number was neither counted nor named missing under its epoch yet. The stream holds each
// FPM once per epoch (the epoch is part of its message id), but not in the order the publisher sent
// them: a bridge that stalled (a full disk, a broker it could not reach, a pause) stores the last FPMs
// it received of a run after the next run's first ones, and redundant bridges that could not agree on
// a run's epoch each store their own copy of it, the older epoch's possibly after the newer one's,
// interleaved with it. None of these is a duplicate. A number past the last one of a run a restart
// ended, under that run's last epoch, goes on with that run: a number it skipped is a gap of that run,
// like any jump. Nothing else is named here: the numbers a late epoch's copy lacks may be in the other
// bridge's copy, under its epoch.
func (t *tracker) late(o *fpmObservation) bool {
	st := t.st
	i := t.epoch(o.Epoch, false)
	if i < 0 {
		if o.Epoch <= st.EpochsFloor {
			return false // forgotten: taken for a copy of what was seen, as nothing tells otherwise
		}
		hole := t.endedRunGoesOn(o)
		if hole == nil {
			hole = t.placedRunBegins(o)
		}
		t.count(o) // the first FPM seen of its epoch
		if hole != nil {
			t.reveal(*hole)
		}
		return true
	}
	e := &st.Epochs[i]
	if rangesHold(e.Seen, o.Seq) {
		return false
	}
	var hole *pending
	if last := e.RunLast; last != nil && o.Seq > last.Seq {
		if o.Seq > last.Seq+1 {
			hole = &pending{Kind: kindJump, Ranges: [][2]uint64{{last.Seq + 1, o.Seq - 1}}, Before: *last, After: o.point(),
				RevealedMs: o.StoredMs, EpochLo: o.Epoch, EpochHi: o.Epoch}
		}
		p := o.point()
		e.RunLast = &p
	}
	t.count(o)
	if hole != nil {
		t.reveal(*hole)
	}
	return true
}

// endedRunGoesOn applies o, a late FPM and the first seen under its epoch, when it goes on with a run
// a restart ended: its epoch is newer than that run's last one and older than any other seen since,
// it is a bridge's first run of the publisher (no run start) and its number is past the run's last.
// Live, such an FPM would have read as that run going on across a restarted bridge's epoch (observe);
// stored after the next run began (a redundant bridge that started while the run went on, held by an
// outage until the run had ended), it reads the same. Its epoch then ends the run (RunLast), and the
// hole between the run's last number and o, returned, is a gap of the run like any jump (nil if none).
func (t *tracker) endedRunGoesOn(o *fpmObservation) *pending {
	st := t.st
	if o.RunStart != "" || o.Epoch >= st.Run.FirstEpoch {
		return nil
	}
	j, _ := slices.BinarySearchFunc(st.Epochs, o.Epoch, func(e epochSeen, epoch int64) int { return cmp.Compare(e.Epoch, epoch) })
	if j == 0 {
		return nil
	}
	prev := &st.Epochs[j-1] // the newest epoch seen below o's
	last := prev.RunLast
	if last == nil || last.Seq == math.MaxUint64 || o.Seq <= last.Seq {
		return nil
	}
	var hole *pending
	if o.Seq > last.Seq+1 {
		hole = &pending{Kind: kindJump, Ranges: [][2]uint64{{last.Seq + 1, o.Seq - 1}}, Before: *last, After: o.point(),
			RevealedMs: o.StoredMs, EpochLo: prev.Epoch, EpochHi: o.Epoch}
	}
	if k := t.epoch(o.Epoch, true); k >= 0 {
		p := o.point()
		st.Epochs[k].RunLast = &p
	}
	return hole
}

// placedRunBegins applies o, a late FPM and the first seen under its epoch, when it began a publisher
// run of its own that reached the stream only after a later epoch's FPMs: the bridge that stored it
// was held up (a full disk, a stopped process) while another, started meanwhile, stored the runs after
// it, which the detector read first. Its epoch lies below a later one seen, o is no copy of numbers the
// epoch after it had when o was received (a redundant bridge's own epoch for that run), and against
// the epoch before it (a run is sent after all of the one before, and its numbers grow with time) o was
// received well after that epoch's last message, with a number at or below what that epoch got to or
// its bridge seeing the run begin (a run start); or well after that epoch's first message, with a
// lower number (that bridge's reader may have received its run's last numbers late, after a stall).
// Its numbers below o's, which no bridge stored, are returned as the run's restart gap under its epoch
// (nil if o did not begin a run); a copy stored later fills it.
func (t *tracker) placedRunBegins(o *fpmObservation) *pending {
	st := t.st
	if o.Epoch >= st.MaxEpoch {
		return nil
	}
	j, _ := slices.BinarySearchFunc(st.Epochs, o.Epoch, func(e epochSeen, epoch int64) int { return cmp.Compare(e.Epoch, epoch) })
	if j == 0 {
		return nil
	}
	if j < len(st.Epochs) {
		// A copy, under an epoch of its own, of numbers the next epoch's run had when it was received
		// is that run's (a redundant bridge that did not agree on it).
		if next := st.Epochs[j].First; next != nil && o.Seq >= next.Seq && o.ObservedAtMs >= next.ObservedAtMs-sameRunTolerance {
			return nil
		}
	}
	prev := st.Epochs[j-1]
	if len(prev.Seen) == 0 || prev.First == nil {
		return nil
	}
	last := prev.Seen[len(prev.Seen)-1][1]
	afterAll := o.ObservedAtMs > prev.LastAtMs+sameRunTolerance && (o.Seq <= last || o.RunStart != "")
	backAfterFirst := o.Seq < prev.First.Seq && o.ObservedAtMs > prev.First.ObservedAtMs+sameRunTolerance
	if !afterAll && !backAfterFirst || o.Seq == 0 {
		return nil // at 0, nothing of the run is missing before o: no gap to name
	}
	st.Counters.Restarts++
	t.significant = true
	var n uint64
	for _, r := range prev.Seen {
		n += r[1] - r[0] + 1
	}
	before := point{Seq: last, ObservedAtMs: prev.LastAtMs, Epoch: prev.Epoch}
	old := runSummary{FirstSeq: prev.Seen[0][0], LastSeq: last, FirstEpoch: prev.Epoch, LastEpoch: prev.Epoch, Messages: n, LastAtMs: prev.LastAtMs}
	p := &pending{Kind: kindRestart, Before: before, After: o.point(), RevealedMs: o.StoredMs, EpochLo: o.Epoch, EpochHi: o.Epoch,
		OldRun: &old, Reconnect: o.RunStart == streams.RunStartReconnect, Placed: true}
	if o.Seq > 0 {
		p.Ranges = [][2]uint64{{0, o.Seq - 1}}
	}
	return p
}

// joinPlaced takes o's epoch into a run whose restart gap is held, when o, under an older epoch newer
// than the run the restart ended, is another bridge's copy of the run's first message (its number,
// received within sameRunTolerance of it) or of the number just before it, received just before it:
// the two bridges could not agree on the run, and the one that recorded it first, held up (a full disk,
// a stopped process), stored its copies after the other's, having stopped, in the second case, just
// before the other's first number. The restart gap then takes that epoch's copies, read already and
// to come; for the current run, its numbers past the run's last go on with it. That epoch's own placed
// start (placedRunBegins), if it had one, is the same run's start: dropped.
func (t *tracker) joinPlaced(o *fpmObservation) {
	st := t.st
	i := slices.IndexFunc(st.Pending, func(p pending) bool {
		if p.Kind != kindRestart || p.EpochLo <= o.Epoch || o.Epoch <= p.Before.Epoch {
			return false
		}
		if o.ObservedAtMs >= p.After.ObservedAtMs-sameRunTolerance && o.ObservedAtMs <= p.After.ObservedAtMs+sameRunTolerance &&
			(o.Seq == p.After.Seq || o.Seq+1 == p.After.Seq && o.ObservedAtMs <= p.After.ObservedAtMs) {
			return true
		}
		return t.runPaceReachesBack(&p, o)
	})
	if i < 0 {
		return
	}
	p := &st.Pending[i]
	p.EpochLo = o.Epoch
	if t.beginsCurrentRun(p) {
		st.Run.FirstEpoch = min(st.Run.FirstEpoch, o.Epoch)
	}
	if k := t.epoch(o.Epoch, false); k >= 0 {
		p.Ranges = minusRanges(p.Ranges, st.Epochs[k].Seen)
	}
	t.significant = true
	if j := slices.IndexFunc(st.Pending, func(q pending) bool { return q.Placed && q.After.Epoch == o.Epoch }); j >= 0 {
		st.Pending = slices.Delete(st.Pending, j, j+1)
		st.Counters.Restarts--
	}
}

// beginsCurrentRun reports whether p's revealing FPM is the current run's first: p holds that run's
// first numbers (its restart or start gap).
func (t *tracker) beginsCurrentRun(p *pending) bool {
	return p.After.Seq == t.st.Run.FirstSeq && p.After.ObservedAtMs == t.st.Run.StartedAtMs
}

// runPaceReachesBack reports whether o, a number below the first of the current run whose restart p
// holds, received before it, is where the run's pace, carried back from that first number, puts the
// run when o was received: within a fifth of the numbers between (at least 2) and within half of o's
// number (at least 1). The bridge that recorded the run first stalled (its process stopped) after a
// few numbers and read the rest late, so that only its first copies were received in time; the other
// joined the run further on and recorded it. A restart after o began at 0 later: at the run's pace it
// is carried back below 0, which the bound keeps from matching. The pace is the run's from its first
// number to its last seen, over at least minPaceNumbers numbers and minPaceSpanMs.
func (t *tracker) runPaceReachesBack(p *pending, o *fpmObservation) bool {
	st := t.st
	if !t.beginsCurrentRun(p) || o.Seq >= p.After.Seq ||
		o.ObservedAtMs >= p.After.ObservedAtMs || o.ObservedAtMs <= p.Before.ObservedAtMs {
		return false
	}
	n, span := st.Run.LastSeq-st.Run.FirstSeq, st.Run.LastAtMs-st.Run.StartedAtMs
	if st.Run.LastSeq <= st.Run.FirstSeq || n < minPaceNumbers || span < minPaceSpanMs {
		return false
	}
	predicted := float64(p.After.Seq) - float64(p.After.ObservedAtMs-o.ObservedAtMs)*float64(n)/float64(span)
	tolerance := min(max(2, float64(p.After.Seq-o.Seq)/5), max(float64(o.Seq)/2, 1))
	return math.Abs(predicted-float64(o.Seq)) <= tolerance
}

// minPaceNumbers and minPaceSpanMs bound what a run's pace is measured on (runPaceReachesBack), so that
// one late message does not make a pace.
const (
	minPaceNumbers = 4
	minPaceSpanMs  = 200
)

// maxNamed bounds epochSeen.Named.
const maxNamed = 64

// named records r, named missing by a gap event about p, under every epoch its numbers were recorded
// seen under (emitPending).
func (t *tracker) named(p *pending, r namedRange) {
	for i := range t.st.Epochs {
		e := &t.st.Epochs[i]
		if e.Epoch != p.After.Epoch && (e.Epoch < p.EpochLo || e.Epoch > p.EpochHi) {
			continue
		}
		e.Named = append(e.Named, r)
		if over := len(e.Named) - maxNamed; over > 0 {
			e.Named = slices.Delete(e.Named, 0, over)
		}
	}
}

// recover applies a late message whose number a gap event named missing under its epoch, and
// reports whether it was one: the event was classified before any bridge had stored the number, and a
// bridge stored it after all (it lagged past the marker grace: a full disk, a broker restart, a
// redundant bridge that joined the run late). It is a message, counted, and no longer missing: taken
// off its cause and, with the contiguous copies that follow it, reported by a recovered event, so
// that the events, the counters and `gaps report` never name a stored FPM missing.
func (t *tracker) recover(o *fpmObservation) bool {
	i := t.epoch(o.Epoch, false)
	if i < 0 {
		return false
	}
	j := slices.IndexFunc(t.st.Epochs[i].Named, func(r namedRange) bool { return o.Seq >= r.Lo && o.Seq <= r.Hi })
	if j < 0 {
		return false
	}
	t.takeBack(o, t.st.Epochs[i].Named[j])
	return true
}

// recoverNear is recover for a late copy under another bridge's epoch of the run whose gap event
// named its number: an epoch within sameRunTolerance of the event's (both bridges received the run's
// first messages about together, and could not agree on it), under which its number is neither
// counted nor named. Without it the copy would be counted under its own epoch while the number stays
// named: a stored FPM named missing.
func (t *tracker) recoverNear(o *fpmObservation) bool {
	st := t.st
	if i := t.epoch(o.Epoch, false); i >= 0 && rangesHold(st.Epochs[i].Seen, o.Seq) {
		return false
	}
	for k := range st.Epochs {
		e := &st.Epochs[k]
		if e.Epoch == o.Epoch || e.Epoch < o.Epoch-sameRunTolerance || e.Epoch > o.Epoch+sameRunTolerance {
			continue
		}
		if j := slices.IndexFunc(e.Named, func(r namedRange) bool { return o.Seq >= r.Lo && o.Seq <= r.Hi }); j >= 0 {
			t.takeBack(o, e.Named[j])
			return true
		}
	}
	return false
}

// takeBack counts o, whose number gap event r named missing, and takes the number back from every
// epoch the event named it under (recover).
func (t *tracker) takeBack(o *fpmObservation, r namedRange) {
	st := t.st
	// The event named the number under every epoch of its gap: taken back once, from all of them.
	for k := range st.Epochs {
		named := st.Epochs[k].Named
		for j := 0; j < len(named); j++ {
			n := named[j]
			if n.Gap != r.Gap || o.Seq < n.Lo || o.Seq > n.Hi {
				continue
			}
			var repl []namedRange
			if o.Seq > n.Lo {
				repl = append(repl, namedRange{Lo: n.Lo, Hi: o.Seq - 1, Cause: n.Cause, Gap: n.Gap})
			}
			if o.Seq < n.Hi {
				repl = append(repl, namedRange{Lo: o.Seq + 1, Hi: n.Hi, Cause: n.Cause, Gap: n.Gap})
			}
			named = slices.Replace(named, j, j+1, repl...)
			break
		}
		st.Epochs[k].Named = named
	}
	t.significant = true
	st.Counters.Missing.sub(r.Cause, 1)
	st.Counters.Recovered++
	t.count(o)
	if rc := st.Recovering; rc != nil && rc.Epoch == o.Epoch && rc.Gap == r.Gap && o.Seq == rc.Hi+1 {
		rc.Hi, rc.Last = o.Seq, o.point()
	} else {
		t.flushRecovered()
		st.Recovering = &recovering{Epoch: o.Epoch, Lo: o.Seq, Hi: o.Seq, Cause: r.Cause, Gap: r.Gap, First: o.point(), Last: o.point()}
	}
	left := false
	for k := range st.Epochs {
		left = left || slices.ContainsFunc(st.Epochs[k].Named, func(n namedRange) bool { return n.Gap == r.Gap })
	}
	if !left {
		t.flushRecovered() // every number the event named is stored: nothing more to wait for
	}
}

// flushRecovered reports the numbers recovered since the last report (state.Recovering) in one
// recovered event. The detector calls it on its clock too, so that a run of copies that simply ends is
// reported.
func (t *tracker) flushRecovered() {
	rc := t.st.Recovering
	if rc == nil {
		return
	}
	t.st.Recovering = nil
	n := rc.Hi - rc.Lo + 1
	first := rc.First
	t.emit(&Event{GapEventFields: streams.GapEventFields{Type: TypeRecovered, ID: streams.RecoveredMsgID(t.key, rc.Epoch, rc.Lo, rc.Hi),
		Cause: rc.Cause, Epoch: rc.Epoch, FirstMissing: u64p(rc.Lo), LastMissing: u64p(rc.Hi), Missing: n, Before: &first},
		After: &rc.Last, Recovers: rc.Gap,
		Evidence: evidence{Summary: fmt.Sprintf("seq %d-%d, named missing (%s) by %s, were stored after all, %d message(s) under epoch %d by bridge %s: it had held them past the marker grace (a full disk, a broker restart, a redundant bridge that lagged); they are no longer missing",
			rc.Lo, rc.Hi, rc.Cause, rc.Gap, n, rc.Epoch, rc.Last.Bridge)}})
}

// endRun marks the current run's last message in state.Epochs as a restart ends the run.
func (t *tracker) endRun() {
	if i := t.epoch(t.st.Last.Epoch, true); i >= 0 {
		last := t.st.Last
		t.st.Epochs[i].RunLast = &last
	}
}

// epoch returns the index of epoch's entry in state.Epochs, or -1; with create, a missing entry is
// added unless the epoch is at or below EpochsFloor.
func (t *tracker) epoch(epoch int64, create bool) int {
	st := t.st
	if n := len(st.Epochs); n > 0 && st.Epochs[n-1].Epoch == epoch {
		return n - 1 // the current epoch, nearly always
	}
	i, found := slices.BinarySearchFunc(st.Epochs, epoch, func(e epochSeen, epoch int64) int { return cmp.Compare(e.Epoch, epoch) })
	switch {
	case found:
		return i
	case !create || epoch <= st.EpochsFloor:
		return -1
	}
	st.Epochs = slices.Insert(st.Epochs, i, epochSeen{Epoch: epoch})
	if over := len(st.Epochs) - maxEpochs; over > 0 {
		st.EpochsFloor = max(st.EpochsFloor, st.Epochs[over-1].Epoch)
		st.Epochs = slices.Delete(st.Epochs, 0, over)
		if i -= over; i < 0 {
			return -1
		}
	}
	return i
}

// seen records lo..hi as counted or named under epoch.
func (t *tracker) seen(epoch int64, lo, hi uint64) {
	if i := t.epoch(epoch, true); i >= 0 {
		t.st.Epochs[i].Seen = addRange(t.st.Epochs[i].Seen, lo, hi)
	}
}

// rangesHold reports whether sorted disjoint ranges rs hold q.
func rangesHold(rs [][2]uint64, q uint64) bool {
	_, found := slices.BinarySearchFunc(rs, q, func(r [2]uint64, q uint64) int {
		switch {
		case r[1] < q:
			return -1
		case r[0] > q:
			return 1
		}
		return 0
	})
	return found
}

// addRange adds lo..hi to sorted disjoint ranges rs, merging what overlaps or touches; beyond
// maxSeenRanges the two ranges closest to each other are merged (the numbers between them taken for
// seen: a late message of one is then a duplicate, never counted twice).
func addRange(rs [][2]uint64, lo, hi uint64) [][2]uint64 {
	if n := len(rs); n > 0 && lo >= rs[n-1][0] && (rs[n-1][1] == math.MaxUint64 || lo <= rs[n-1][1]+1) {
		rs[n-1][1] = max(rs[n-1][1], hi) // the sequence going on, nearly always
		return rs
	}
	i, _ := slices.BinarySearchFunc(rs, lo, func(r [2]uint64, lo uint64) int { return cmp.Compare(r[0], lo) })
	rs = slices.Insert(rs, i, [2]uint64{lo, hi})
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 && (out[n-1][1] == math.MaxUint64 || r[0] <= out[n-1][1]+1) {
			out[n-1][1] = max(out[n-1][1], r[1])
			continue
		}
		out = append(out, r)
	}
	for len(out) > maxSeenRanges {
		j := 0
		for k := 1; k+1 < len(out); k++ {
			if out[k+1][0]-out[k][1] < out[j+1][0]-out[j][1] {
				j = k
			}
		}
		out[j][1] = out[j+1][1]
		out = slices.Delete(out, j+1, j+2)
	}
	return out
}

func (t *tracker) startRun(o *fpmObservation, byRestart bool) {
	t.st.Run = runSummary{
		FirstSeq: o.Seq, LastSeq: o.Seq, FirstEpoch: o.Epoch, LastEpoch: o.Epoch,
		StartedAtMs: o.ObservedAtMs, LastAtMs: o.ObservedAtMs, ByRestart: byRestart,
	}
	t.st.MaxEpoch = o.Epoch
	t.st.Last = o.point()
}

// restart ends the current run at o, the first message of a new one. The new run's numbers below
// o.Seq that never arrived are held like a gap (markers may cover some); the publisher_restart event
// is emitted when they are classified (at once when o.Seq is 0). reconnect: the sequence did not go
// back, the bridges took the run for a new one because it began on a new connection (cause
// reconnect).
func (t *tracker) restart(o *fpmObservation, afterStale bool, silentMs int64, reconnect bool, markedFrom int64) {
	st := t.st
	t.markedTail(o)
	t.markedRuns(o)
	old := st.Run
	before := st.Last
	t.endRun()
	t.startRun(o, true)
	st.Counters.Restarts++
	p := pending{
		Kind: kindRestart, Before: before, After: o.point(), RevealedMs: o.StoredMs,
		EpochLo: o.Epoch, EpochHi: o.Epoch, OldRun: &old, AfterStale: afterStale, SilentMs: silentMs, Reconnect: reconnect,
	}
	if markedFrom != 0 {
		// The run began under the marker's epoch: its markers cover its first numbers, and they are
		// the run's own (never counted again as drops of a run nobody saw, unrevealed.go).
		p.EpochLo, st.Run.FirstEpoch = markedFrom, markedFrom
	}
	if o.Seq > 0 {
		p.Ranges = [][2]uint64{{0, o.Seq - 1}}
	}
	t.reveal(p)
}

// markedRestart returns the epoch of a drop marker that shows a publisher restart between the last FPM
// seen and o (showsRestart), the oldest if several, 0 if none. Without it o would read as the old run
// going on and the new run's numbers before it as a jump of the old run, named under no epoch of
// theirs. The detector applies o only once the markers stored about when it was are
// (waitsForMarkers); one read later still is applied by markedLate.
func (t *tracker) markedRestart(o *fpmObservation) int64 {
	st := t.st
	var from int64
	next := o.point()
	for i := range st.Markers {
		m := &st.Markers[i]
		if showsRestart(m, st.MaxEpoch, st.Last, next) && (from == 0 || m.Epoch < from) {
			from = m.Epoch
		}
	}
	return from
}

// markedPast reports whether a drop marker of o's bridge, under an epoch of the current run or one
// between the last FPM seen and o's, names the run's numbers past that FPM (numbers its bridge
// received and could not store, as markedTail takes them) up to o's number or past it: the run got
// there before o's epoch began, and a bridge receives a publisher's numbers in order and, started
// again, only those sent after, so o, a bridge's first run (no run start) that would otherwise read as
// the run going on, begins a new run. The restart then names the old run's numbers up to the marker's
// last under its epochs (markedTail). (A marker under an epoch between that begins at or below the
// last FPM is a run of its own: showsRestart.)
func (t *tracker) markedPast(o *fpmObservation) bool {
	st := t.st
	if st.Last.Seq == math.MaxUint64 {
		return false
	}
	for i := range st.Markers {
		m := &st.Markers[i]
		if m.Used || m.Bridge != o.Bridge || m.Epoch < st.Run.FirstEpoch || m.Epoch >= o.Epoch ||
			m.LastSeq <= st.Last.Seq || m.LastSeq < o.Seq || m.Epoch > st.MaxEpoch && m.FirstSeq <= st.Last.Seq {
			continue
		}
		return true
	}
	return false
}

// showsRestart reports whether drop marker m shows a publisher restart between last, the last FPM seen
// of a run, and next, an FPM that would make the run go on under a bridge epoch newer than maxEpoch
// (every epoch seen before it): m is under an epoch between them, of which nothing was stored, and
// its numbers begin where only a new run can. A bridge saw the run begin, dropped its first numbers
// (a stop while its store refused writes, so that it could neither record the run nor store any of
// it) and stored nothing of it; the next FPM, a bridge's first run of the publisher (no run start),
// is the new run's.
//   - A marker of next's bridge: from 0, or from at or below the last number seen when that was the
//     same bridge's (a bridge gives a run that goes on a new epoch only when it starts again, and then
//     past every number it received before: it missed the run's 0, subscribing after it was sent).
//   - Last's bridge's, whoever's next is: from at or below last's number, received after last was
//     (that bridge's numbers went back: it stopped, and started again on a new run).
//   - Another bridge's: from 0, received after last was. Redundant bridges that could not agree give
//     one run two epochs and either may have dropped numbers below the other's, but a bridge that
//     received a run's 0 after another bridge's later number of it cannot be reading that run.
func showsRestart(m *heldMarker, maxEpoch int64, last, next point) bool {
	if m.Used || m.Epoch <= maxEpoch || m.Epoch >= next.Epoch || last.Seq == math.MaxUint64 {
		return false
	}
	if m.Bridge == next.Bridge && (m.FirstSeq == 0 || m.FirstSeq <= last.Seq && last.Bridge == m.Bridge) {
		return true
	}
	if m.Bridge == last.Bridge && m.FirstSeq <= last.Seq && m.FirstReceivedAtMs > last.ObservedAtMs {
		return true
	}
	return m.FirstSeq == 0 && m.FirstReceivedAtMs > last.ObservedAtMs
}

// maxCrossings bounds state.Crossings; the oldest go first.
const maxCrossings = 8

// cross records that the run is taken to go on from st.Last to o across o's new bridge epoch.
func (t *tracker) cross(o *fpmObservation) {
	st := t.st
	st.Crossings = append(st.Crossings, crossing{MaxEpoch: st.MaxEpoch, Before: st.Last, After: o.point()})
	if n := len(st.Crossings); n > maxCrossings {
		st.Crossings = slices.Delete(st.Crossings, 0, n-maxCrossings)
	}
}

// markedLate applies drop marker m read after the FPM whose run it shows began (showsRestart), past
// the marker grace the detector waited for it: a bridge stopped while its store refused writes
// spools its markers and publishes them only when it starts again. The crossing it falls in was a
// restart. The new run's numbers up to the last one the old run got to, taken then for the old run's
// (counted or named under its epochs), are revealed as a gap of the new run under the marker's
// epoch: those m covers are the bridge's drops, the others a publisher_restart's missing numbers;
// the numbers above them the crossing's jump named already. It reports whether m was such a marker.
func (t *tracker) markedLate(m *heldMarker) bool {
	st := t.st
	for i := len(st.Crossings) - 1; i >= 0; i-- {
		c := st.Crossings[i]
		if !showsRestart(m, c.MaxEpoch, c.Before, c.After) || t.epoch(m.Epoch, false) >= 0 {
			continue
		}
		st.Crossings = slices.Delete(st.Crossings, i, i+1)
		st.Counters.Restarts++
		t.reveal(pending{Kind: kindMarked, Ranges: [][2]uint64{{0, c.Before.Seq}}, Before: c.Before,
			After:      point{Seq: m.LastSeq, ObservedAtMs: m.LastReceivedAtMs, Epoch: m.Epoch, Bridge: m.Bridge},
			RevealedMs: m.LastReceivedAtMs, EpochLo: m.Epoch, EpochHi: m.Epoch})
		return true
	}
	return false
}

// waitsForMarkers reports whether o, applied now, would take the run as going on across a new bridge
// epoch (a bridge's first run of the publisher: no run start, the sequence gone on) with no drop marker
// applied that shows a restart in between (markedRestart). One stored about when o was could still:
// a bridge started again publishes the markers its previous run spooled beside its first FPMs, and
// the stream may store them, and the marker reader deliver them, after o. The detector applies such
// an FPM once the markers stored up to its stream time plus the marker grace are applied.
func (t *tracker) waitsForMarkers(o *fpmObservation) bool {
	st := t.st
	return st.Started && o.RunStart == "" && o.Epoch > st.MaxEpoch && o.Seq > st.Last.Seq && t.markedRestart(o) == 0
}

// markedTail extends the run a restart at o ends by the numbers drop markers name beyond its last
// FPM here: its last FPMs were dropped (a full store, a bridge stopped before it could store them),
// and nothing stored of it comes after them, so only the markers say how far the run got. The
// numbers up to the markers' last are revealed as a gap like any jump: those the markers cover
// named as the bridge's drops, those between the last FPM and the markers (sent while no bridge was
// subscribed, a bridge restart) named as lost before the bridge. A marker of the run's epochs may
// begin at or below its last FPM (counted from the number after it); one of a later epoch, a bridge
// that started meanwhile, only when it goes on from it, as an FPM of that epoch would (a marker that
// begins lower, or whose bridge saw the publisher restart, is a run of its own, counted from the
// marker alone, see unrevealed.go and markedrun.go).
func (t *tracker) markedTail(o *fpmObservation) {
	st := t.st
	if st.Last.Seq == math.MaxUint64 {
		return
	}
	var tail *heldMarker
	for i := range st.Markers {
		m := &st.Markers[i]
		if m.Epoch < st.Run.FirstEpoch || m.Epoch >= o.Epoch || m.LastSeq <= st.Last.Seq ||
			m.Epoch > st.MaxEpoch && (m.FirstSeq <= st.Last.Seq || m.RunStart == streams.RunStartRestart) {
			continue
		}
		if tail == nil || m.LastSeq > tail.LastSeq {
			tail = m
		}
	}
	if tail == nil {
		return
	}
	after := t.revealMarkedTail(st.Last, tail, o.StoredMs)
	st.Last = after
	st.Run.LastSeq, st.Run.LastEpoch = tail.LastSeq, max(st.Run.LastEpoch, tail.Epoch)
	st.MaxEpoch = max(st.MaxEpoch, tail.Epoch)
}

// markedEndedTail is markedTail for a marker applied after the restart that ended its run (markers
// are read beside the FPMs, and a bridge that stopped while the store refused writes publishes them
// when it is back): the run is found by the marker's epoch, the newest seen at or before it, when
// that is where a restart ended a run (state.Epochs' RunLast).
func (t *tracker) markedEndedTail(m *heldMarker) {
	st := t.st
	if !st.Started || m.Epoch >= st.Run.FirstEpoch {
		return // the current run's: a later FPM reveals it, or the report counts it (unrevealed.go)
	}
	i, found := slices.BinarySearchFunc(st.Epochs, m.Epoch, func(e epochSeen, epoch int64) int { return cmp.Compare(e.Epoch, epoch) })
	if !found {
		i--
	}
	if i < 0 {
		return
	}
	e := &st.Epochs[i]
	last := e.RunLast
	if last == nil || last.Seq == math.MaxUint64 || m.LastSeq <= last.Seq ||
		e.Epoch < m.Epoch && (m.FirstSeq <= last.Seq || m.RunStart == streams.RunStartRestart) {
		return
	}
	ended := e.Epoch
	after := t.revealMarkedTail(*last, m, m.LastReceivedAtMs)
	// The run now ends at the marker's last number, under its own epoch's entry as well, so that a late
	// FPM past it and the report (unrevealed.go) go on from there. (Revealing may have added entries to
	// State.Epochs: the entry is found again.)
	if k := t.epoch(ended, false); k >= 0 {
		st.Epochs[k].RunLast = &point{Seq: after.Seq, ObservedAtMs: after.ObservedAtMs, Epoch: last.Epoch, Bridge: last.Bridge}
	}
	if ended != m.Epoch {
		if j := t.epoch(m.Epoch, true); j >= 0 {
			st.Epochs[j].RunLast = &after
		}
	}
}

// revealMarkedTail reveals a run's numbers after before up to marker m's last as a gap, and returns
// the marker's point: where the run got to.
func (t *tracker) revealMarkedTail(before point, m *heldMarker, revealedMs int64) point {
	after := point{Seq: m.LastSeq, ObservedAtMs: m.LastReceivedAtMs, Epoch: m.Epoch, Bridge: m.Bridge}
	t.reveal(pending{
		Kind: kindJump, Ranges: [][2]uint64{{before.Seq + 1, m.LastSeq}},
		Before: before, After: after, RevealedMs: revealedMs,
		EpochLo: min(before.Epoch, m.Epoch), EpochHi: max(before.Epoch, m.Epoch),
	})
	return after
}

// goStale emits the stale event of the silence after st.Last. Its content depends only on the state,
// so the live path (wall clock) and a replay (event time) publish the same event.
func (t *tracker) goStale() {
	st := t.st
	last := st.Last
	st.Stale = &last
	st.Counters.StalePeriods++
	t.emit(&Event{
		GapEventFields: streams.GapEventFields{Type: typeStale, ID: streams.StaleMsgID(t.key, last.Epoch, last.Seq),
			Cause: CauseStale, Epoch: last.Epoch, Before: &last},
		StaleAfterMs: t.r.staleAfterMs, StaleAtMs: st.LastSeenMs + t.r.staleAfterMs,
		Evidence: evidence{Summary: fmt.Sprintf("nothing heard from the publisher, not even a heartbeat, for %v after seq %d",
			time.Duration(t.r.staleAfterMs)*time.Millisecond, last.Seq)},
	})
}

// markStale is the wall-clock path: the caller saw no message for StaleAfter while caught up.
func (t *tracker) markStale() bool {
	if !t.st.Started || t.st.Stale != nil {
		return false
	}
	t.significant = true
	t.goStale()
	return true
}

func (t *tracker) resume(o *fpmObservation, stale *point, restarted, reconnect bool) {
	st := t.st
	st.Stale = nil
	after := o.point()
	silent := o.ObservedAtMs - stale.ObservedAtMs
	sum := fmt.Sprintf("heard again after %v of silence at seq %d (last was %d); the publisher did not restart",
		time.Duration(silent)*time.Millisecond, o.Seq, stale.Seq)
	switch {
	case reconnect:
		sum = fmt.Sprintf("heard again after %v of silence at seq %d (last was %d) on a new connection of the bridge; the publisher may have restarted meanwhile (see the reconnect gap)",
			time.Duration(silent)*time.Millisecond, o.Seq, stale.Seq)
	case restarted:
		sum = fmt.Sprintf("heard again after %v of silence at seq %d (last was %d); the publisher restarted meanwhile",
			time.Duration(silent)*time.Millisecond, o.Seq, stale.Seq)
	}
	t.emit(&Event{
		GapEventFields: streams.GapEventFields{Type: typeResumed, ID: streams.ResumedMsgID(t.key, stale.Epoch, stale.Seq),
			Cause: CauseStale, Epoch: o.Epoch, Before: stale},
		After: &after, StaleAfterMs: t.r.staleAfterMs, Restarted: boolp(restarted),
		Evidence: evidence{Summary: sum, SilentMs: silent, EpochChanged: stale.Epoch != o.Epoch,
			BridgeChanged: stale.Bridge != o.Bridge, AfterStale: true},
	})
}

// reveal adds a pending gap and classifies it at once if drop markers already cover all of it.
func (t *tracker) reveal(p pending) {
	t.st.Pending = append(t.st.Pending, p)
	t.tryResolve(len(t.st.Pending)-1, false)
}

// fill removes a late message's number from the pending gap holding it.
func (t *tracker) fill(o *fpmObservation) bool {
	for i := range t.st.Pending {
		p := &t.st.Pending[i]
		if o.Epoch < p.EpochLo || o.Epoch > p.EpochHi {
			continue
		}
		for j, r := range p.Ranges {
			if o.Seq < r[0] || o.Seq > r[1] {
				continue
			}
			var repl [][2]uint64
			if o.Seq > r[0] {
				repl = append(repl, [2]uint64{r[0], o.Seq - 1})
			}
			if o.Seq < r[1] {
				repl = append(repl, [2]uint64{o.Seq + 1, r[1]})
			}
			p.Ranges = slices.Replace(p.Ranges, j, j+1, repl...)
			if p.Kind == kindRestart && p.Reconnect && o.Seq <= p.Before.Seq {
				p.Reconnect = false // a copy from a bridge that saw the sequence go back: a restart for certain
			}
			if len(p.Ranges) == 0 && p.Kind != kindRestart {
				t.st.Pending = slices.Delete(t.st.Pending, i, i+1)
			} else {
				t.tryResolve(i, false)
			}
			return true
		}
	}
	return false
}

// addMarker applies a drop marker stored at FPM_EVENTS sequence eventsSeq.
func (t *tracker) addMarker(m streams.DropMarker, eventsSeq uint64) {
	st := t.st
	t.significant = true
	st.MarkerSeq = eventsSeq
	st.Counters.Markers++
	st.Markers = append(st.Markers, heldMarker{DropMarker: m})
	t.markedEndedTail(&st.Markers[len(st.Markers)-1])
	if !t.markedLate(&st.Markers[len(st.Markers)-1]) {
		t.markedRunLate(&st.Markers[len(st.Markers)-1])
	}
	for i := 0; i < len(st.Pending); {
		if !t.tryResolve(i, false) {
			i++
		}
	}
	t.prune()
}

// expire classifies every pending gap revealed at least the marker grace before watermarkMs (stream
// time up to which every drop marker has been applied). It returns how many it classified.
func (t *tracker) expire(watermarkMs int64) int {
	n := 0
	for i := 0; i < len(t.st.Pending); {
		if t.st.Pending[i].RevealedMs+t.r.graceMs <= watermarkMs {
			t.tryResolve(i, true)
			n++
			continue
		}
		i++
	}
	if n > 0 {
		t.significant = true
		if len(t.st.Markers) > 0 {
			t.prune()
		}
	}
	return n
}

// segment is a piece of a pending gap with one cause.
type segment struct {
	first, last uint64
	covered     bool
}

// segments splits p's ranges into pieces covered by a compatible drop marker and pieces that are not,
// marking the markers used.
func (t *tracker) segments(p *pending, mark bool) (segs []segment, full bool) {
	full = true
	var cov [][2]uint64
	for _, r := range p.Ranges {
		cov = cov[:0]
		for i := range t.st.Markers {
			m := &t.st.Markers[i]
			if m.Epoch < p.EpochLo || m.Epoch > p.EpochHi || m.LastSeq < r[0] || m.FirstSeq > r[1] {
				continue
			}
			cov = append(cov, [2]uint64{max(m.FirstSeq, r[0]), min(m.LastSeq, r[1])})
			if mark {
				m.Used = true
			}
		}
		slices.SortFunc(cov, func(a, b [2]uint64) int {
			switch {
			case a[0] < b[0]:
				return -1
			case a[0] > b[0]:
				return 1
			}
			return 0
		})
		next := r[0]
		done := false
		for _, c := range cov {
			if done || c[1] < next {
				continue
			}
			if c[0] > next {
				segs = append(segs, segment{next, c[0] - 1, false})
				full = false
			}
			start := max(c[0], next)
			if n := len(segs); n > 0 && segs[n-1].covered && segs[n-1].last+1 == start {
				segs[n-1].last = c[1]
			} else {
				segs = append(segs, segment{start, c[1], true})
			}
			if c[1] == r[1] {
				done = true
				continue
			}
			next = c[1] + 1
		}
		if !done {
			segs = append(segs, segment{next, r[1], false})
			full = false
		}
	}
	return segs, full
}

// tryResolve classifies pending gap i when markers cover all of it, or always when force is set
// (the marker grace has passed), emits its events and removes it. It reports whether it did.
//
// With redundant bridges (state.Redundant) markers alone never classify a gap before the grace: a drop
// marker says what one bridge dropped, and the other bridge may store those FPMs later (the stream
// holds the union of what the bridges stored). Its late copies fill the gap meanwhile; what is still
// missing when the grace passes, no bridge stored, and the markers covering it say why.
func (t *tracker) tryResolve(i int, force bool) bool {
	p := &t.st.Pending[i]
	if !force && t.st.Redundant && len(p.Ranges) > 0 {
		return false
	}
	segs, full := t.segments(p, false)
	if !full && !force {
		return false
	}
	segs, _ = t.segments(p, true)
	pd := *p
	t.st.Pending = slices.Delete(t.st.Pending, i, i+1)
	t.emitPending(&pd, segs)
	return true
}

func (t *tracker) emitPending(p *pending, segs []segment) {
	for _, s := range segs {
		// Named missing under the gap's epochs: a copy stored later is not counted again.
		t.seen(p.After.Epoch, s.first, s.last)
		for i := range t.st.Epochs {
			if e := t.st.Epochs[i].Epoch; e >= p.EpochLo && e <= p.EpochHi && e != p.After.Epoch {
				t.st.Epochs[i].Seen = addRange(t.st.Epochs[i].Seen, s.first, s.last)
			}
		}
	}
	before := &p.Before
	if p.Kind == kindStart {
		before = nil // nothing of the run came before the gap
	}
	base := evidence{AfterStale: p.AfterStale}
	if before != nil {
		base.EpochChanged, base.BridgeChanged = p.Before.Epoch != p.After.Epoch, p.Before.Bridge != p.After.Bridge
	}
	if p.AfterStale {
		base.SilentMs = p.SilentMs
	}
	if p.Kind == kindRestart {
		var missing uint64
		var ranges [][2]uint64
		for _, s := range segs {
			if !s.covered {
				missing += s.last - s.first + 1
				ranges = append(ranges, [2]uint64{s.first, s.last})
			}
		}
		ev := base
		ev.OldRun = p.OldRun
		ev.NewRunFirstSeq = u64p(p.After.Seq)
		cause := CausePublisherRestart
		switch {
		case p.Reconnect:
			cause = causeReconnect
			ev.Summary = fmt.Sprintf("the bridge's connection to the publisher ended and a new one began, and the sequence went on from %d to %d under a new bridge epoch: the publisher may have restarted while the bridge was disconnected (its new run's first numbers were sent before the bridge was connected again), so they are named missing; if only the connection broke, the old run's numbers up to %d named here were stored under epoch %d; the old run got to seq %d (%d messages from seq %d)",
				p.Before.Seq, p.After.Seq, p.Before.Seq, p.Before.Epoch, p.OldRun.LastSeq, p.OldRun.Messages, p.OldRun.FirstSeq)
		case p.After.Seq > p.Before.Seq:
			ev.Summary = fmt.Sprintf("the bridges saw the publisher restart (its sequence went back) before seq %d, which came after %d under a new bridge epoch; the old run got to seq %d (%d messages from seq %d)",
				p.After.Seq, p.Before.Seq, p.OldRun.LastSeq, p.OldRun.Messages, p.OldRun.FirstSeq)
		default:
			ev.Summary = fmt.Sprintf("the sequence went back from %d to %d under a new bridge epoch: the publisher restarted; the old run got to seq %d (%d messages from seq %d)",
				p.Before.Seq, p.After.Seq, p.OldRun.LastSeq, p.OldRun.Messages, p.OldRun.FirstSeq)
		}
		if missing > 0 {
			ev.Summary += fmt.Sprintf("; %d of the new run's first %d messages never arrived", missing, p.After.Seq)
		}
		e := &Event{GapEventFields: streams.GapEventFields{Type: TypeGap, ID: streams.RestartMsgID(t.key, p.After.Epoch),
			Cause: cause, Epoch: p.After.Epoch, Missing: missing, Before: &p.Before}, After: &p.After, Evidence: ev}
		if len(ranges) > 0 {
			e.FirstMissing, e.LastMissing = u64p(ranges[0][0]), u64p(ranges[len(ranges)-1][1])
			if len(ranges) > 1 {
				e.MissingRanges = ranges
			}
		}
		for _, r := range ranges {
			t.named(p, namedRange{Lo: r[0], Hi: r[1], Cause: cause, Gap: e.ID})
		}
		t.emit(e)
	}
	for _, s := range segs {
		if p.Kind == kindRestart && !s.covered {
			continue
		}
		ev := base
		cause := CauseZMQDrop
		n := s.last - s.first + 1
		switch {
		case s.covered:
			cause = CauseBridgeDrop
			reasons := ""
			for i := range t.st.Markers {
				m := &t.st.Markers[i]
				if m.Epoch >= p.EpochLo && m.Epoch <= p.EpochHi && m.LastSeq >= s.first && m.FirstSeq <= s.last {
					ev.Markers = append(ev.Markers, markerRef(&m.DropMarker))
					if reasons == "" {
						reasons = m.Reason
					} else if !containsWord(reasons, m.Reason) {
						reasons += ", " + m.Reason
					}
				}
			}
			ev.Summary = fmt.Sprintf("the bridge dropped %d message(s) itself (%s) and published drop markers covering them", n, reasons)
		case p.Kind == kindStart && s.first == 0:
			cause = CauseLateStart
			t.lateStartEvidence(&ev, p, s)
		case p.Kind == kindStart:
			ev.MarkerGraceMs = t.r.graceMs
			ev.Summary = fmt.Sprintf("seq %d-%d of the run's first numbers never reached the bridge although it had received seq %d, and no drop marker covered them within %v: lost before the bridge (publisher send buffer full or ZMQ transport)",
				s.first, s.last, s.first-1, time.Duration(t.r.graceMs)*time.Millisecond)
		case p.Kind == kindMarked:
			cause = CausePublisherRestart
			ev.NewRunFirstSeq = u64p(0)
			ev.Summary = fmt.Sprintf("a drop marker read after the fact shows the publisher restarted after seq %d (a bridge saw its sequence begin again under epoch %d, and stored nothing of the run): seq %d-%d of the new run, taken then for the old run's numbers, never reached the stream",
				p.Before.Seq, p.After.Epoch, s.first, s.last)
		case p.Kind == kindResume:
			cause = CauseStale
			ev.Summary = fmt.Sprintf("the publisher was silent for %v and came back %d number(s) further with no drop marker: lost while nothing reached the bridge (node or network loss)",
				time.Duration(p.SilentMs)*time.Millisecond, n)
		default:
			ev.MarkerGraceMs = t.r.graceMs
			ev.Summary = fmt.Sprintf("the bridge received seq %d after %d and no drop marker covered the %d missing number(s) within %v: lost before the bridge (publisher send buffer full or ZMQ transport)",
				p.After.Seq, p.Before.Seq, n, time.Duration(t.r.graceMs)*time.Millisecond)
			if ev.EpochChanged {
				ev.Summary += "; the bridge epoch changed across the gap (a bridge restart or handover: sent while no bridge was subscribed)"
			}
		}
		id := streams.GapMsgID(t.key, p.After.Epoch, s.first, s.last)
		t.named(p, namedRange{Lo: s.first, Hi: s.last, Cause: cause, Gap: id})
		t.emit(&Event{GapEventFields: streams.GapEventFields{Type: TypeGap, ID: id,
			Cause: cause, Epoch: p.After.Epoch, FirstMissing: u64p(s.first), LastMissing: u64p(s.last), Missing: n, Before: before},
			After: &p.After, Evidence: ev})
	}
}

// lateStartEvidence describes late_start segment s (0..first seen - 1) of start gap p. The bridge
// does not publish when its socket connected; what it does publish is the run's epoch, its receive
// time of the run's first message, so the evidence is the first number it received and that time:
// the bridge was subscribed by then at the latest.
func (t *tracker) lateStartEvidence(ev *evidence, p *pending, s segment) {
	first := s.last + 1
	ev.FirstSeenSeq = u64p(first)
	ev.SubscribedByMs = p.After.Epoch
	ev.MarkerGraceMs = t.r.graceMs
	at := time.UnixMilli(p.After.Epoch).UTC().Format(time.RFC3339Nano)
	ev.Summary = fmt.Sprintf("the first number of this run that reached the bridge was seq %d: the %d before it were sent before the bridge was subscribed (the publisher started before the bridge, or the bridge connected late); the bridge does not report when it connected, its first receive of the run (the epoch, %s) is the latest it was subscribed by",
		first, first, at)
	if p.After.Seq == first && p.After.ObservedAtMs > p.After.Epoch {
		// Not the bridge's first message of its epoch: the bridge received earlier ones of this run
		// that never reached the detector (stored and removed from FPM before it read them, for one).
		ev.Summary += fmt.Sprintf("; but the bridge received seq %d %v after the epoch: it had received earlier messages of the run that never reached the detector (removed from FPM by its limits before the detector read them?)",
			first, time.Duration(p.After.ObservedAtMs-p.After.Epoch)*time.Millisecond)
	}
}

func containsWord(list, w string) bool {
	for len(list) > 0 {
		i := 0
		for i < len(list) && list[i] != ',' {
			i++
		}
		if list[:i] == w {
			return true
		}
		if i+2 > len(list) {
			break
		}
		list = list[i+2:]
	}
	return false
}

// emit numbers e, counts it and appends it to the outbox.
func (t *tracker) emit(e *Event) {
	st := t.st
	t.significant = true
	if st.NextEventSeq == 0 {
		st.NextEventSeq = 1
	}
	e.Schema = EventSchema
	e.Key = t.key
	e.EventSeq = st.NextEventSeq
	st.NextEventSeq++
	if e.Type == TypeGap {
		st.Counters.Gaps.add(e.Cause, 1)
		st.Counters.Missing.add(e.Cause, e.Missing)
	}
	st.Outbox = append(st.Outbox, *e)
	if t.onEmit != nil {
		t.onEmit(&st.Outbox[len(st.Outbox)-1])
	}
}

// prune drops the markers that can no longer explain a gap: not covering a pending one, and not for
// numbers or epochs beyond the newest message.
func (t *tracker) prune() {
	st := t.st
	if !st.Started {
		return
	}
	keep := st.Markers[:0]
	for _, m := range st.Markers {
		if t.useful(&m) {
			keep = append(keep, m)
		} else if !m.Used {
			st.Counters.MarkersUnused++
		}
	}
	clear(st.Markers[len(keep):])
	st.Markers = keep
	if over := len(st.Markers) - maxMarkers; over > 0 {
		slices.SortStableFunc(st.Markers, func(a, b heldMarker) int {
			switch {
			case a.Epoch != b.Epoch:
				if a.Epoch < b.Epoch {
					return -1
				}
				return 1
			case a.FirstSeq < b.FirstSeq:
				return -1
			case a.FirstSeq > b.FirstSeq:
				return 1
			}
			return 0
		})
		for _, m := range st.Markers[:over] {
			if !m.Used {
				st.Counters.MarkersUnused++
			}
		}
		st.Markers = slices.Delete(st.Markers, 0, over)
	}
}

func (t *tracker) useful(m *heldMarker) bool {
	st := t.st
	if m.Epoch > st.Last.Epoch || (m.Epoch == st.Last.Epoch && m.LastSeq > st.Last.Seq) {
		return true
	}
	for i := range st.Pending {
		p := &st.Pending[i]
		if m.Epoch < p.EpochLo || m.Epoch > p.EpochHi {
			continue
		}
		for _, r := range p.Ranges {
			if m.LastSeq >= r[0] && m.FirstSeq <= r[1] {
				return true
			}
		}
	}
	return false
}
