package durable

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/streams"
)

// ErrDeliveryLimit is the reason of a message dead-lettered for being delivered more than
// Config.MaxDeliveries times.
var ErrDeliveryLimit = errors.New("durable: delivery limit reached")

// Headers of a consumer's dead letter, beyond the bridge's Fpm-Error.
const (
	HeaderConsumer  = "Fpm-Consumer"   // the consumer that gave the message up
	HeaderStream    = "Fpm-Stream"     // the stream the message is stored in
	HeaderStreamSeq = "Fpm-Stream-Seq" // its sequence there: `nats stream get <stream> <seq>` shows it
	HeaderSubject   = "Fpm-Subject"    // its subject
	HeaderDelivered = "Fpm-Delivered"  // how often it was delivered
)

// RejectedSubject is where consumer name's dead letters go: fpmevents.rejected.<consumer>.
func RejectedSubject(name string) string { return streams.EventsRoot + ".rejected." + name }

// deadLetter publishes m as a dead letter (its body, truncated to what the server accepts, and the
// headers above) and settles it: terminated under explicit acks, done under cumulative acks. If the
// dead letter cannot be stored the message stays held and is tried again at the next settle: nothing
// is given up without a record of it.
func (r *Runner) deadLetter(ctx context.Context, m *Msg, reason error) {
	s := m.sess
	dl := nats.NewMsg(RejectedSubject(r.cfg.Name))
	data := m.raw.Data()
	if maxp := r.js.Conn().MaxPayload() - 4096; maxp > 0 && int64(len(data)) > maxp {
		dl.Header.Set(streams.HeaderOriginalSize, strconv.Itoa(len(data)))
		data = data[:maxp]
	}
	dl.Data = data
	for k, v := range m.raw.Headers() {
		// Nats-* headers are the server's (the message id, Nats-Stream-Source on a partition stream's
		// copy): the server refuses a publish carrying some of them.
		if !strings.HasPrefix(k, "Nats-") && len(v) > 0 && len(k)+len(v[0]) < 1024 {
			dl.Header.Set(k, v[0])
		}
	}
	dl.Header.Set(HeaderConsumer, r.cfg.Name)
	dl.Header.Set(HeaderStream, r.cfg.Group.Stream)
	dl.Header.Set(HeaderStreamSeq, strconv.FormatUint(m.StreamSeq, 10))
	if len(m.Subject()) < 1024 {
		dl.Header.Set(HeaderSubject, m.Subject())
	}
	dl.Header.Set(HeaderDelivered, strconv.FormatUint(m.Delivered, 10))
	dl.Header.Set(streams.HeaderError, reason.Error())
	dl.Header.Set(nats.MsgIdHdr, "rejected:"+r.cfg.Name+":"+r.cfg.Group.Stream+":"+strconv.FormatUint(m.StreamSeq, 10))
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
	r.log.Warn("message dead-lettered", "subject", m.Subject(), "stream", r.cfg.Group.Stream,
		"stream_seq", m.StreamSeq, "delivered", m.Delivered, "reason", reason, "dead_letter", dl.Subject)
	r.m.terminated.Inc()
	if !r.cfg.Group.CumulativeAcks {
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
