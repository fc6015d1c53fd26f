package trace

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
//     SampleInterval + 2*FlushInterval by the writer's clock. It is written only if its counter_id
//     differs from the key's last written line (an unchanged counter is not repeated).
//   - On graceful stop every pending message is written (same counter rule).
//   - A message that gets no line (superseded in its interval, unchanged counter, or late: from an
//     interval already written) is acked after the next flush, behind the lines appended before it.
//     The pending message itself is acked once its own line is durable. Acking a superseded message
//     before the pending one's line is durable loses nothing: the unacked pending message carries the
//     newer observation and is redelivered if the writer dies; holding every superseded message
//     instead would keep rate x interval messages per key unacked and stall the consumer at
//     MaxAckPending.
type sampler struct {
	intervalMs int64
	hold       time.Duration
	keys       map[sampleKey]*sample
	order      []*sample // creation order: emission order is deterministic
	watermark  int64     // newest observed_at_unix_ms seen
}

type sampleKey struct {
	namespace, component, producer, workerID string
	dpRank                                   int64
}

type sample struct {
	p *producer
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

func newSampler(interval time.Duration) *sampler {
	return &sampler{
		intervalMs: interval.Milliseconds(),
		keys:       map[sampleKey]*sample{},
		watermark:  -1,
	}
}

// add takes r as the newest pending message of its key, or queues its ack.
func (s *sampler) add(w *Writer, r *record) error {
	if s.hold == 0 {
		s.hold = time.Duration(s.intervalMs)*time.Millisecond + 2*w.cfg.FlushInterval
	}
	k := sampleKey{
		namespace: r.key.Namespace, component: r.key.Component, producer: r.producer,
		workerID: r.fpm.WorkerID, dpRank: r.fpm.DPRank,
	}
	e, ok := s.keys[k]
	if !ok {
		p, err := w.producerFor(r.producer)
		if err != nil {
			return err
		}
		e = &sample{p: p}
		s.keys[k] = e
		s.order = append(s.order, e)
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
		old := e.rec.msg
		e.rec = *r
		return w.ackAfterFlush(e.p, old)
	case e.has: // older than the pending one
		return w.ackAfterFlush(e.p, r.msg)
	case e.emitted && iv <= e.lastInterval: // late: its interval is written already
		return w.ackAfterFlush(e.p, r.msg)
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
		if s.watermark >= end+s.intervalMs || now.Sub(e.heldSince) >= s.hold {
			if err := s.emit(w, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// emitAll writes every pending message (graceful stop).
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

// emit writes e's pending message unless its counter_id equals the last written one.
func (s *sampler) emit(w *Writer, e *sample) error {
	r := e.rec
	e.has, e.rec = false, record{}
	e.emitted, e.lastInterval = true, e.interval
	if e.written && r.fpm.CounterID == e.lastCounter {
		return w.ackAfterFlush(e.p, r.msg)
	}
	if err := w.write(e.p, &r); err != nil {
		return err
	}
	e.written, e.lastCounter = true, r.fpm.CounterID
	e.p.pending = append(e.p.pending, pendingAck{msg: r.msg, seq: e.p.sw.Appended()})
	return w.account(e.p, 1)
}

// nakAll naks the pending messages (failed run): they are redelivered at once.
func (s *sampler) nakAll() {
	for _, e := range s.order {
		if e.has {
			_ = e.rec.msg.Nak()
			e.has, e.rec = false, record{}
		}
	}
}

// ackAfterFlush queues the ack of a message that needs no line behind p's lines appended so far.
func (w *Writer) ackAfterFlush(p *producer, m jetstream.Msg) error {
	p.pending = append(p.pending, pendingAck{msg: m, seq: p.sw.Appended()})
	return w.account(p, 1)
}
