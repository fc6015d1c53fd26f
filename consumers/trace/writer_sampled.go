package trace

import (
	"time"
)

// Sampled mode (DYN_FPM_MODE=sampled), as Dynamo samples, with intervals aligned to event time so that
// a replay of the same messages writes the same events:
//
//   - The key is (namespace, component, producer_id, worker_id, dp_rank). Each key holds at most one
//     pending message: the newest (by observed_at_unix_ms) of the current interval. Intervals are
//     [k*SampleInterval, (k+1)*SampleInterval) of observed_at_unix_ms.
//   - A key's pending message is written when its interval is over: when a message of the key from a
//     later interval arrives, when the newest observation of any key is one whole interval past its end
//     (checked every FlushInterval), or, if nothing newer arrives at all, when it has been held for
//     SampleInterval + 2*FlushInterval by the writer's clock (the wall-clock fallback; a backfill has
//     none: it writes what is pending when the range ends). It is written only if its counter_id
//     differs from the key's last written line (an unchanged counter is not repeated).
//   - On graceful stop every pending message is written (same counter rule).
//   - A message that gets no line (superseded in its interval, unchanged counter, or late: from an
//     interval already written) is done after the next flush, behind the lines appended before it.
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
	order      []*sample // creation order: emission order is deterministic
	watermark  int64     // newest observed_at_unix_ms seen
}

type sampleKey struct {
	namespace, component, producer, workerID string
	dpRank                                   int64
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
	opened    msgMeta
	// last emitted interval (written, or skipped for an unchanged counter)
	emitted      bool
	lastInterval int64
	// last written line (by this writer, or found on disk: a seed, a backfill's existing lines)
	written         bool
	lastCounter     int64
	writtenInterval int64
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
		namespace: r.key.Namespace, component: r.key.Component, producer: r.producer,
		workerID: r.fpm.workerID, dpRank: r.fpm.dpRank,
	}
	e, ok := s.keys[k]
	if !ok {
		e = &sample{key: k}
		s.keys[k] = e
		s.order = append(s.order, e)
	}
	if e.p == nil {
		p, err := w.producerFor(r.producer)
		if err != nil {
			return err
		}
		e.p = p
	}
	s.watermark = max(s.watermark, r.observed)
	iv := r.observed / s.intervalMs
	if e.has && iv > e.interval {
		if err := s.emit(w, e); err != nil {
			return err
		}
	}
	switch {
	case e.has && r.observed >= e.rec.observed: // newer in the same interval: replaces the pending one
		old := e.rec
		e.rec = *r
		return w.doneAfterFlush(e.p, &old)
	case e.has: // older than the pending one
		return w.doneAfterFlush(e.p, r)
	case e.emitted && iv <= e.lastInterval: // late: its interval is written already
		return w.doneAfterFlush(e.p, r)
	}
	e.has, e.rec, e.interval, e.heldSince = true, *r, iv, w.set.Clock()
	e.opened = msgMeta{seq: r.seq, stored: r.stored}
	return nil
}

// emitDue writes the pending messages whose interval is over (see sampler).
func (s *sampler) emitDue(w *writer, now time.Time) error {
	for _, e := range s.order {
		if !e.has {
			continue
		}
		end := (e.interval + 1) * s.intervalMs
		if s.watermark >= end+s.intervalMs || s.hold > 0 && now.Sub(e.heldSince) >= s.hold {
			if err := s.emit(w, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// emitAll writes every pending message (graceful stop, end of a backfill).
func (s *sampler) emitAll(w *writer) error {
	for _, e := range s.order {
		if e.has {
			if err := s.emit(w, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// drop forgets the keys of producer p (its file refused its name) and hands each pending message of
// them to reject; it returns how many there were.
func (s *sampler) drop(p *producer, reject func(*record)) int {
	n := 0
	kept := s.order[:0]
	for _, e := range s.order {
		if e.p != p {
			kept = append(kept, e)
			continue
		}
		if e.has {
			reject(&e.rec)
			n++
		}
	}
	clear(s.order[len(kept):])
	s.order = kept
	for k, e := range s.keys {
		if e.p == p {
			delete(s.keys, k)
		}
	}
	return n
}

// emit writes e's pending message unless its counter_id equals the last written one. A backfill writes
// no line for an interval its output has one for (backfill_existing.go), and compares the counter with
// the key's last line before the interval, on disk or its own.
func (s *sampler) emit(w *writer, e *sample) error {
	r := e.rec
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
	if e.written && r.fpm.counterID == e.lastCounter {
		return w.doneAfterFlush(e.p, &r)
	}
	if err := w.write(e.p, &r); err != nil {
		return err
	}
	e.written, e.lastCounter, e.writtenInterval = true, r.fpm.counterID, e.interval
	e.p.pending = append(e.p.pending, pendingDone{d: r.d, line: e.p.sw.Appended()})
	return w.account(e.p, 1)
}

// openSince returns the first message (stream sequence and time; the earliest by before) of the
// intervals still open, whose samples are not written yet; ok is false when none is open.
func (s *sampler) openSince(before func(a, b msgMeta) bool) (first msgMeta, ok bool) {
	for _, e := range s.order {
		if e.has && (!ok || before(e.opened, first)) {
			first, ok = e.opened, true
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
}

// doneAfterFlush queues the Done of a message that needs no line behind p's lines appended so far.
func (w *writer) doneAfterFlush(p *producer, r *record) error {
	p.pending = append(p.pending, pendingDone{d: r.d, line: p.sw.Appended()})
	return w.account(p, 1)
}
