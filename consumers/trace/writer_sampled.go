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
//     interval already written) is acked after the next flush, behind the lines appended before it.
//     The pending message itself is acked once its own line is durable. Acking a superseded message
//     before the pending one's line is durable loses nothing: the unacked pending message carries the
//     newer observation and is redelivered if the writer dies; holding every superseded message
//     instead would keep rate x interval messages per key unacked and stall the consumer at
//     MaxAckPending.
//   - After a restart, the keys whose segments the recovery read start from their last written line
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
	p *producer // nil for a seeded key until its first message
	// pending message, if has
	has       bool
	rec       record
	interval  int64
	heldSince time.Time
	// last emitted interval (written, or skipped for an unchanged counter)
	emitted      bool
	lastInterval int64
	// last written line
	written     bool
	lastCounter int64
}

func newSampler(interval, hold time.Duration) *sampler {
	return &sampler{
		intervalMs: interval.Milliseconds(),
		hold:       hold,
		keys:       map[sampleKey]*sample{},
		watermark:  -1,
	}
}

// seed starts key k from its last written line (startup recovery).
func (s *sampler) seed(k sampleKey, sd recoverSeed) {
	if _, ok := s.keys[k]; ok {
		return
	}
	e := &sample{emitted: true, lastInterval: sd.interval, written: true, lastCounter: sd.counter}
	s.keys[k] = e
	s.order = append(s.order, e)
}

// add takes r as the newest pending message of its key, or queues its ack.
func (s *sampler) add(w *Writer, r *record) error {
	k := sampleKey{
		namespace: r.key.Namespace, component: r.key.Component, producer: r.producer,
		workerID: r.fpm.workerID, dpRank: r.fpm.dpRank,
	}
	e, ok := s.keys[k]
	if !ok {
		e = &sample{}
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
		return w.ackAfterFlush(e.p, &old)
	case e.has: // older than the pending one
		return w.ackAfterFlush(e.p, r)
	case e.emitted && iv <= e.lastInterval: // late: its interval is written already
		return w.ackAfterFlush(e.p, r)
	}
	e.has, e.rec, e.interval, e.heldSince = true, *r, iv, w.now()
	return nil
}

// emitDue writes the pending messages whose interval is over (see sampler).
func (s *sampler) emitDue(w *Writer, now time.Time) error {
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
func (s *sampler) emitAll(w *Writer) error {
	for _, e := range s.order {
		if e.has {
			if err := s.emit(w, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// emitProducers writes the pending messages of the given producers (their partition is revoked).
func (s *sampler) emitProducers(w *Writer, ps map[*producer]bool) error {
	for _, e := range s.order {
		if e.has && ps[e.p] {
			if err := s.emit(w, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// forget drops the keys of the given producers (after their release).
func (s *sampler) forget(ps map[*producer]bool) {
	kept := s.order[:0]
	for _, e := range s.order {
		if e.p == nil || !ps[e.p] {
			kept = append(kept, e)
		}
	}
	clear(s.order[len(kept):])
	s.order = kept
	for k, e := range s.keys {
		if e.p != nil && ps[e.p] {
			delete(s.keys, k)
		}
	}
}

// emit writes e's pending message unless its counter_id equals the last written one.
func (s *sampler) emit(w *Writer, e *sample) error {
	r := e.rec
	e.has, e.rec = false, record{}
	e.emitted, e.lastInterval = true, e.interval
	if e.written && r.fpm.counterID == e.lastCounter {
		return w.ackAfterFlush(e.p, &r)
	}
	if err := w.write(e.p, &r); err != nil {
		return err
	}
	e.written, e.lastCounter = true, r.fpm.counterID
	e.p.pending = append(e.p.pending, pendingAck{msg: r.msg, seq: e.p.sw.Appended(), sseq: r.seq})
	return w.account(e.p, 1)
}

// nakAll naks the pending messages (failed run): they are redelivered at once.
func (s *sampler) nakAll(w *Writer) {
	for _, e := range s.order {
		if e.has {
			if !w.noNak {
				_ = e.rec.msg.Nak()
			}
			w.seqs.release(e.rec.seq)
			e.has, e.rec = false, record{}
		}
	}
}

// ackAfterFlush queues the ack of a message that needs no line behind p's lines appended so far.
func (w *Writer) ackAfterFlush(p *producer, r *record) error {
	p.pending = append(p.pending, pendingAck{msg: r.msg, seq: p.sw.Appended(), sseq: r.seq})
	return w.account(p, 1)
}
