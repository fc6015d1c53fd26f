package durable

import (
	"context"
	"errors"
	"strconv"

	"github.com/fpmbus/fpmbus/streams"
)

// errDeliveryLimit is the reason of a message dead-lettered for being delivered more than
// Config.MaxDeliveries times.
var errDeliveryLimit = errors.New("durable: delivery limit reached")

// Stages of a consumer's dead letter (Fpm-Error-Stage).
const (
	// stageRejected: the consumer said the message can never succeed (Msg.Reject).
	stageRejected = "rejected"
	// stageDeliveryLimit: the message was delivered more than MaxDeliveries times, or kept failing the
	// instances that took it.
	stageDeliveryLimit = "delivery_limit"
)

// RejectedSubject is where consumer name's dead letters go (streams.ConsumerDeadLetterSubject).
func RejectedSubject(name string) string { return streams.ConsumerDeadLetterSubject(name) }

// deadLetter publishes m as a dead letter (streams.DeadLetter from a MessageSource: its body, cut to
// what the server accepts, the reason, and where it was stored) and settles it: terminated under
// explicit acks, done under cumulative acks. If the dead letter cannot be stored the message stays
// held and is tried again at the next settle: nothing is given up without a record of it.
func (r *Runner) deadLetter(ctx context.Context, m *Msg, reason error) {
	s := m.sess
	stage := stageRejected
	if errors.Is(reason, errDeliveryLimit) {
		stage = stageDeliveryLimit
	}
	dl := (&streams.DeadLetter{
		Stage:      stage,
		Reason:     reason.Error(),
		Frames:     [][]byte{m.raw.Data()},
		ReceivedAt: m.received,
		MaxPayload: r.js.Conn().MaxPayload(),
		Source: &streams.MessageSource{Consumer: r.cfg.Name, Stream: r.group.Stream, StreamSeq: m.StreamSeq,
			Subject: m.Subject()},
	}).Msg()
	dl.Header.Set(streams.HeaderDelivered, strconv.FormatUint(m.Delivered, 10))
	pctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if _, err := r.js.PublishMsg(pctx, dl); err != nil {
		r.log.Warn("dead letter not stored; the message stays held and is tried again",
			"subject", m.Subject(), "stream_seq", m.StreamSeq, "reason", reason, "err", err)
		s.mu.Lock()
		s.rejects = append(s.rejects, rejected{m: m, reason: reason})
		s.mu.Unlock()
		return
	}
	r.log.Warn("message dead-lettered", "subject", m.Subject(), "stream", r.group.Stream,
		"stream_seq", m.StreamSeq, "delivered", m.Delivered, "reason", reason, "dead_letter", dl.Subject)
	r.m.terminated.Inc()
	if !r.group.CumulativeAcks {
		_ = m.raw.TermWithReason(truncate(reason.Error(), 256))
	}
	s.terminated(m.idx)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
