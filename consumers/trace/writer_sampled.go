package trace

import (
	"cmp"
	"slices"
	"time"

	"github.com/fpmbus/fpmbus/tracefile"
)

// Sampled mode (DYN_FPM_MODE=sampled), as Dynamo samples, with intervals aligned to event time so that
// a replay of the same messages writes the same events:
//
//   - The key is (namespace, component, producer_id, worker_id, dp_rank), Dynamo's (source, worker_id,
//     dp_rank). Each key holds at most one pending message: the newest (by observed_at_unix_ms) of the
//     current interval. Intervals are [k*SampleInterval, (k+1)*SampleInterval) of observed_at_unix_ms;
//     a key gets at most one line per interval.
//   - A message whose counter_id equals the last one decided for its key (written, or about to be) is
//     ignored, as Dynamo ignores an arrival equal to the last counter it emitted: the pending message
//     stays pending (a repeat never displaces a newer sample), and no counter is written twice in a
//     row.
//   - A key's interval is over when a message of the key from a later interval arrives, when the newest
//     observation of any key is one whole interval past its end (checked every FlushInterval), or, if
//     nothing newer arrives at all, when its pending message has been held for SampleInterval +
//     2*FlushInterval by the writer's clock (the wall-clock fallback; a backfill has none: it writes
//     what is pending when the range ends). Its pending message is then decided, and written at the
//     next flush tick together with every other decided one, ordered by interval and then by key
//     (byte order of the strings, dp_rank by value), as Dynamo writes each flush's pending keys in the
//     order of its sorted map.
//   - On graceful stop every pending message is written, in that order.
//   - A message that gets no line (superseded in its interval, an ignored repeat, or late: from an
//     interval already decided) is done after the next flush, behind the lines appended before it.
//     The pending message itself is done once its own line is durable. Acknowledging a superseded
//     message before the pending one's line is durable loses nothing: the unacknowledged pending
//     message carries the newer observation and is redelivered if the writer dies; holding every
//     superseded message instead would keep rate x interval messages per key unacknowledged and stall
//     the consumer at MaxAckPending. (For the same reason sampled mode acks each message, not the done
//     prefix: see Config.cumulativeAcks.)
//   - After a takeover, the keys whose segments the takeover read start from their last written line
//     (seed): a redelivered message of an interval already written is late, not a second sample.
type sampler struct {
	intervalMs int64
	hold       time.Duration // wall-clock fallback; <= 0: none
	keys       map[sampleKey]*sample
	order      []*sample  // creation order
	decided    []decision // intervals over, their lines not written yet
	watermark  int64      // newest observed_at_unix_ms seen
}

type sampleKey struct {
	namespace, component, producer, workerID string
	dpRank                                   int64
}

// compareSampleKeys orders keys as Dynamo's BTreeMap of (source, worker_id, dp_rank) does.
func compareSampleKeys(a, b sampleKey) int {
	return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.component, b.component),
		cmp.Compare(a.producer, b.producer), cmp.Compare(a.workerID, b.workerID), cmp.Compare(a.dpRank, b.dpRank))
}

type sample struct {
	key sampleKey
	p   *producer // nil for a seeded key until its first message
	// pending message, if has; opened is the first message of the key seen in its interval (a
	// backfill resumes no later than that: backfill.go)
	has       bool
	rec       record
	interval  int64
	heldSince time.Time
	opened    tracefile.MsgMeta
	// last decided interval (its line written or to be written)
	emitted      bool
	lastInterval int64
	// last decided counter_id (by this writer, or found on disk: a seed, a backfill's existing lines)
	written         bool
	lastCounter     int64
	writtenInterval int64
}

// decision is a key's sample of an interval that is over, to be written at the next flush tick; opened
// is the first message of the key in that interval (sample.opened).
type decision struct {
	e        *sample
	rec      record
	interval int64
	opened   tracefile.MsgMeta
}

func newSampler(interval, hold time.Duration) *sampler {
	return &sampler{
		intervalMs: interval.Milliseconds(),
		hold:       hold,
		keys:       map[sampleKey]*sample{},
		watermark:  -1,
	}
}

// seed starts key k from its last written line (found by a takeover).
func (s *sampler) seed(k sampleKey, sd recoverSeed) {
	if _, ok := s.keys[k]; ok {
		return
	}
	e := &sample{key: k, emitted: true, lastInterval: sd.interval, written: true, lastCounter: sd.counter, writtenInterval: sd.interval}
	s.keys[k] = e
	s.order = append(s.order, e)
}

// add takes r as the newest pending message of its key, or queues its Done.
func (s *sampler) add(w *writer, r *record) error {
	k := sampleKey{
		namespace: r.Key.Namespace, component: r.Key.Component, producer: r.Producer,
		workerID: r.FPM.WorkerID, dpRank: r.FPM.DPRank,
	}
	e, ok := s.keys[k]
	if !ok {
		e = &sample{key: k}
		s.keys[k] = e
		s.order = append(s.order, e)
	}
	if e.p == nil {
		p, err := w.producerFor(r.Producer)
		if err != nil {
			return err
		}
		e.p = p
	}
	s.watermark = max(s.watermark, r.Observed)
	iv := r.Observed / s.intervalMs
	if e.has && iv > e.interval {
		if err := s.decide(w, e); err != nil {
			return err
		}
	}
	switch {
	case e.written && r.FPM.CounterID == e.lastCounter: // a repeat of the last counter: ignored
		return w.doneAfterFlush(e.p, r)
	case e.has && r.Observed >= e.rec.Observed: // newer in the same interval: replaces the pending one
		old := e.rec
		e.rec = *r
		return w.doneAfterFlush(e.p, &old)
	case e.has: // older than the pending one
		return w.doneAfterFlush(e.p, r)
	case e.emitted && iv <= e.lastInterval: // late: its interval is decided already
		return w.doneAfterFlush(e.p, r)
	}
	e.has, e.rec, e.interval, e.heldSince = true, *r, iv, w.set.Clock()
	e.opened = tracefile.MsgMeta{Seq: r.Seq, Stored: r.Stored}
	return nil
}

// emitDue decides the pending messages whose interval is over (see sampler) and writes every decided
// sample.
func (s *sampler) emitDue(w *writer, now time.Time) error {
	for _, e := range s.order {
		if !e.has {
			continue
		}
		end := (e.interval + 1) * s.intervalMs
		if s.watermark >= end+s.intervalMs || s.hold > 0 && now.Sub(e.heldSince) >= s.hold {
			if err := s.decide(w, e); err != nil {
				return err
			}
		}
	}
	return s.writeDecided(w)
}

// emitAll writes every pending message (graceful stop, end of a backfill).
func (s *sampler) emitAll(w *writer) error {
	for _, e := range s.order {
		if e.has {
			if err := s.decide(w, e); err != nil {
				return err
			}
		}
	}
	return s.writeDecided(w)
}

// drop forgets the keys of producer p (its file refused its name) and hands each pending or decided
// message of them to reject. None of them was counted as waiting: a sample waits for its line only
// once it is written.
func (s *sampler) drop(p *producer, reject func(*record)) {
	s.decided = slices.DeleteFunc(s.decided, func(d decision) bool {
		if d.e.p == p {
			reject(&d.rec)
			return true
		}
		return false
	})
	kept := s.order[:0]
	for _, e := range s.order {
		if e.p != p {
			kept = append(kept, e)
			continue
		}
		if e.has {
			reject(&e.rec)
		}
	}
	clear(s.order[len(kept):])
	s.order = kept
	for k, e := range s.keys {
		if e.p == p {
			delete(s.keys, k)
		}
	}
}

// decide ends e's interval: its pending message becomes the key's sample of it, written at the next
// writeDecided. A counter equal to the last decided one never becomes pending (add). A backfill
// decides no line for an interval its output has one for (backfill_existing.go), and compares the
// counter with the key's last line before the interval, on disk or its own; such a message is done
// after the next flush, without a line.
func (s *sampler) decide(w *writer, e *sample) error {
	r, opened := e.rec, e.opened
	e.has, e.rec = false, record{}
	e.emitted, e.lastInterval = true, e.interval
	if x := w.existing; x != nil {
		prefix := e.p.sw.Prefix()
		if prev, ok := x.before(prefix, e.key, e.interval); ok && (!e.written || prev.interval > e.writtenInterval) {
			e.written, e.lastCounter, e.writtenInterval = true, prev.counter, prev.interval
		}
		if counter, ok := x.sampled(prefix, e.key, e.interval, &r); ok {
			e.written, e.lastCounter, e.writtenInterval = true, counter, e.interval
			return w.doneAfterFlush(e.p, &r)
		}
	}
	if e.written && r.FPM.CounterID == e.lastCounter {
		return w.doneAfterFlush(e.p, &r)
	}
	s.decided = append(s.decided, decision{e: e, rec: r, interval: e.interval, opened: opened})
	e.written, e.lastCounter, e.writtenInterval = true, r.FPM.CounterID, e.interval
	return nil
}

// writeDecided writes the decided samples, by interval and then in Dynamo's key order.
func (s *sampler) writeDecided(w *writer) error {
	slices.SortStableFunc(s.decided, func(a, b decision) int {
		return cmp.Or(cmp.Compare(a.interval, b.interval), compareSampleKeys(a.e.key, b.e.key))
	})
	for i := range s.decided {
		d := &s.decided[i]
		if err := w.write(d.e.p, &d.rec); err != nil {
			s.decided = slices.Delete(s.decided, 0, i)
			return err
		}
		d.e.p.pending = append(d.e.p.pending, pendingDone{d: d.rec.d, line: d.e.p.sw.Appended()})
		if err := w.account(d.e.p, 1); err != nil {
			s.decided = slices.Delete(s.decided, 0, i+1)
			return err
		}
	}
	clear(s.decided)
	s.decided = s.decided[:0]
	return nil
}

// openSince returns the first message (stream sequence and time; the earliest by before) of the
// intervals whose samples are not written yet, still open or decided; ok is false when there is none.
func (s *sampler) openSince(before func(a, b tracefile.MsgMeta) bool) (first tracefile.MsgMeta, ok bool) {
	for _, e := range s.order {
		if e.has && (!ok || before(e.opened, first)) {
			first, ok = e.opened, true
		}
	}
	for _, d := range s.decided {
		if !ok || before(d.opened, first) {
			first, ok = d.opened, true
		}
	}
	return first, ok
}

// clear forgets every pending message (the writer aborts): not done, they are redelivered to the
// partition's next owner.
func (s *sampler) clear() {
	for _, e := range s.order {
		e.has, e.rec = false, record{}
	}
	clear(s.decided)
	s.decided = s.decided[:0]
}

// doneAfterFlush queues the Done of a message that needs no line behind p's lines appended so far.
func (w *writer) doneAfterFlush(p *producer, r *record) error {
	p.pending = append(p.pending, pendingDone{d: r.d, line: p.sw.Appended()})
	return w.account(p, 1)
}
