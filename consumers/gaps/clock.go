package gaps

import (
	"errors"
	"math"

	"github.com/nats-io/nats.go/jetstream"
)

// checkClock runs the wall-clock checks: publishers idle past CheckpointInterval get their advances
// checkpointed, silent publishers go stale, FPMs that wait for drop markers are applied once the
// markers are (waitsForMarkers), and pending gaps whose marker grace has passed (in stream
// time: every drop marker, and every FPM of the gap's publisher, stored up to it has been applied)
// are classified. Numbers recovered since the last tick (copies of numbers a gap event named missing)
// are reported.
func (d *Detector) checkClock() {
	now := d.now()
	d.retryOrphans()
	var stale, waiting []*entry
	pending, nStale := 0, 0
	for _, e := range d.keys {
		if e.waitSeq != 0 {
			waiting = append(waiting, e)
		}
		if e.st.Recovering != nil {
			e.t.flushRecovered()
			d.touch(e)
		}
		if e.changed && now.Sub(e.written) >= d.cfg.CheckpointInterval {
			d.markDirty(e) // idle since: checkpoint what it advanced
		}
		if e.st.Stale != nil {
			nStale++
		} else if e.st.Started && now.Sub(e.lastLocal) >= d.cfg.StaleAfter {
			stale = append(stale, e)
		}
		pending += len(e.st.Pending)
	}
	for _, e := range stale {
		if !d.silent(e) {
			continue
		}
		if e.t.markStale() {
			nStale++
			d.touch(e)
		}
	}
	if pending > 0 || len(waiting) > 0 {
		if ts, ok := d.markers.caughtUpAt(d.js, d.mkDeliveredFrom, d.mkDelivered, d.cfg.PublishTimeout); ok {
			d.mkCaughtUpMs = max(d.mkCaughtUpMs, ts.UnixMilli())
		}
		wm := d.markersAppliedMs()
		for _, e := range waiting {
			if wm < e.waitUntilMs {
				continue
			}
			if err := d.catchUpFPM(e, math.MaxUint64); err != nil {
				d.logger.Warn("gap detector: catch-up read failed; FPMs waiting for drop markers wait on", "key", e.key.String(), "err", err)
				e.catchUp = true
			}
		}
		pending = 0
		for _, e := range d.keys {
			if len(e.st.Pending) > 0 && e.t.expire(min(wm, d.fpmsAppliedUpTo(e, wm))) > 0 {
				d.touch(e)
			}
			pending += len(e.st.Pending)
		}
	}
	d.metrics.stale.Set(float64(nStale))
	d.metrics.pending.Set(float64(pending))
	d.metrics.publishers.Set(float64(len(d.keys)))
}

// silent reports whether the stream holds no FPM of e after the last one applied (reading those a
// takeover left to catch up first): then it is stale, whatever the partition consumer still holds.
func (d *Detector) silent(e *entry) bool {
	if e.catchUp {
		before := e.st.StreamSeq
		if err := d.catchUpFPM(e, math.MaxUint64); err != nil {
			d.logger.Warn("gap detector: catch-up read failed", "key", e.key.String(), "err", err)
			e.catchUp = true
			return false
		}
		if e.st.StreamSeq != before {
			e.lastLocal = d.now()
			return false
		}
	}
	_, err := d.store.nextFPM(e.key, e.st.StreamSeq+1)
	return errors.Is(err, jetstream.ErrMsgNotFound)
}

// fpmsAppliedUpTo is the stream time (Unix ms) up to which every FPM of e stored in FPM has been
// applied, looked up only when a pending gap of e would be classified at watermarkMs (the markers'
// watermark, returned as is when nothing limits it). A gap's missing numbers can be stored after the
// FPM that revealed it: a bridge resends what it had in flight to a stream leader that stopped
// answering, after newer numbers reached the next leader. Live, they are applied within moments; but
// a detector reading a backlog (after a takeover or a restart) sees the markers' watermark at the
// server's clock long before its partition consumer reaches them, so without this bound it would name
// stored numbers missing. If the stream cannot be asked, nothing is classified this time.
func (d *Detector) fpmsAppliedUpTo(e *entry, watermarkMs int64) int64 {
	due := false
	for _, p := range e.st.Pending {
		due = due || p.RevealedMs+d.rules.graceMs <= watermarkMs
	}
	if !due {
		return watermarkMs
	}
	if e.catchUp {
		// A publisher loaded from its checkpoint at a takeover: the FPMs the previous owner applied
		// and acked after that checkpoint are read from the stream now, not only when a delivery of
		// the publisher comes (on an idle partition none may ever come).
		if err := d.catchUpFPM(e, math.MaxUint64); err != nil {
			d.logger.Warn("gap detector: catch-up read failed; pending gaps wait", "key", e.key.String(), "err", err)
			return math.MinInt64
		}
	}
	next, err := d.store.nextFPM(e.key, e.st.StreamSeq+1)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return watermarkMs // every FPM of e stored so far is applied
	case err != nil:
		d.logger.Warn("gap detector: next FPM not read; pending gaps wait", "key", e.key.String(), "err", err)
		return math.MinInt64
	}
	return next.Time.UnixMilli() - 1 // everything of e stored before next is applied
}
