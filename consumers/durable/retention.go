package durable

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
)

// Loss is the body of a loss event on fpmevents.loss.<consumer> (header Fpm-Event: loss): stream
// sequences First..Last (Count messages) were removed from Stream before Consumer read them.
type Loss struct {
	Event      string `json:"event"` // "loss"
	Cause      string `json:"cause"` // LossRetention or LossDeleted
	Consumer   string `json:"consumer"`
	Stream     string `json:"stream"`
	First      uint64 `json:"first_seq"`
	Last       uint64 `json:"last_seq"`
	Count      uint64 `json:"count"`
	DetectedAt int64  `json:"detected_at_unix_ms"`
}

// Causes of a Loss.
const (
	// LossRetention: the stream's limits (max_bytes, max_age, max_msgs) removed the messages: they lie
	// below the stream's first sequence.
	LossRetention = "retention"
	// LossDeleted: the messages were removed one by one (a purge by subject, `nats stream rmm`,
	// max_msgs_per_subject) while later ones remain.
	LossDeleted = "deleted"
)

// LossSubject is where consumer name's loss events go.
func LossSubject(name string) string { return streams.EventsRoot + ".loss." + name }

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
	stream := r.cfg.Group.ConsumerStreamOf(p)
	firstKept := uint64(0)
	if st, err := r.js.Stream(cctx, stream); err == nil {
		firstKept = st.CachedInfo().State.FirstSeq
	}
	parts := []Loss{{Cause: LossDeleted, First: first, Last: last}}
	switch {
	case firstKept > last:
		parts[0].Cause = LossRetention
	case firstKept > first:
		parts = []Loss{{Cause: LossRetention, First: first, Last: firstKept - 1}, {Cause: LossDeleted, First: firstKept, Last: last}}
	}
	for _, l := range parts {
		l.Event, l.Consumer, l.Stream = "loss", r.cfg.Name, stream
		l.Count = l.Last - l.First + 1
		l.DetectedAt = r.now().UnixMilli()
		r.m.lost.Add(float64(l.Count))
		r.log.Warn("messages removed from the stream before this consumer read them", "cause", l.Cause,
			"stream", l.Stream, "first_seq", l.First, "last_seq", l.Last, "count", l.Count)
		body, _ := json.Marshal(l)
		msg := nats.NewMsg(LossSubject(r.cfg.Name))
		msg.Data = body
		msg.Header.Set(streams.HeaderEventType, "loss")
		msg.Header.Set(nats.MsgIdHdr, "loss:"+r.cfg.Name+":"+l.Stream+":"+strconv.FormatUint(l.First, 10)+"-"+strconv.FormatUint(l.Last, 10))
		if _, err := r.js.PublishMsg(cctx, msg); err != nil {
			r.log.Warn("loss event not stored", "err", err)
		}
	}
}
