package durable

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
)

// Retention loss: a delivery whose stream sequence skips past the last one delivered means the stream
// removed messages this consumer never read. Each loss is reported as a streams.ConsumerLoss event on
// streams.ConsumerLossSubject(<consumer>), a log line and fpmbus_consumer_retention_lost_total.

// checkRetention reports the stream sequences between the last delivered message and seq as lost.
func (r *Runner) checkRetention(ctx context.Context, s *session, seq uint64) {
	if s.seqKnown && seq > s.lastSeq+1 {
		r.reportLoss(ctx, s.p, s.lastSeq+1, seq-1)
	}
	if !s.seqKnown || seq > s.lastSeq {
		s.lastSeq, s.seqKnown = seq, true
	}
}

// reportLoss classifies first..last of partition p's stream (the group's stream, or p's shard) by the
// stream's first sequence now and reports each part: log line, metric and event. An event that cannot
// be stored is still in the log and the metric.
func (r *Runner) reportLoss(ctx context.Context, p int, first, last uint64) {
	cctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	stream := r.group.ConsumerStreamOf(p)
	firstKept := uint64(0)
	if st, err := r.js.Stream(cctx, stream); err == nil {
		firstKept = st.CachedInfo().State.FirstSeq
	}
	parts := []streams.ConsumerLoss{{Cause: streams.LossDeleted, First: first, Last: last}}
	switch {
	case firstKept > last:
		parts[0].Cause = streams.LossRetention
	case firstKept > first:
		parts = []streams.ConsumerLoss{{Cause: streams.LossRetention, First: first, Last: firstKept - 1}, {Cause: streams.LossDeleted, First: firstKept, Last: last}}
	}
	for _, l := range parts {
		l.Event, l.Consumer, l.Stream = streams.ConsumerLossEvent, r.cfg.Name, stream
		l.Count = l.Last - l.First + 1
		l.DetectedAt = r.now().UnixMilli()
		r.m.lost.Add(float64(l.Count))
		r.log.Warn("messages removed from the stream before this consumer read them", "cause", l.Cause,
			"stream", l.Stream, "first_seq", l.First, "last_seq", l.Last, "count", l.Count)
		body, _ := json.Marshal(l)
		msg := nats.NewMsg(streams.ConsumerLossSubject(r.cfg.Name))
		msg.Data = body
		msg.Header.Set(streams.HeaderEventType, streams.ConsumerLossEvent)
		msg.Header.Set(streams.HeaderMsgID, streams.ConsumerLossMsgID(r.cfg.Name, l.Stream, l.First, l.Last))
		if _, err := r.js.PublishMsg(cctx, msg); err != nil {
			r.log.Warn("loss event not stored", "err", err)
		}
	}
}
