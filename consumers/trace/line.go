package trace

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// record is one message of the FPM stream, checked and ready to become a trace line.
type record struct {
	msg      jetstream.Msg
	key      streams.Key // from the subject: namespace, component, worker_id, dp_rank
	body     []byte      // the canonical FPM JSON, valid (checkFPM): the message body itself
	fpm      fpmIdent    // worker_id, dp_rank and counter_id of the body
	observed int64       // observed_at_unix_ms
	producer string      // producer id (unsanitized), as written in event.source.producer_id
	// From the JetStream metadata; zero when the message has none (then it is never deduplicated).
	seq       uint64    // stream sequence on FPM
	delivered uint64    // delivery count: > 1 for a redelivery
	stored    time.Time // stream timestamp
}

// msgMeta is what the writer needs from a message's JetStream metadata.
type msgMeta struct {
	seq       uint64
	delivered uint64
	stored    time.Time
}

// metaOf reads a message's metadata from its reply subject. A source whose messages are not the FPM
// stream's own (a partition stream) substitutes a function that returns the FPM stream sequence.
type metaOf func(jetstream.Msg) (msgMeta, error)

// jsMeta is the metaOf of messages consumed from stream FPM itself.
func jsMeta(m jetstream.Msg) (msgMeta, error) {
	md, err := m.Metadata()
	if err != nil {
		return msgMeta{}, err
	}
	return msgMeta{seq: md.Sequence.Stream, delivered: md.NumDelivered, stored: md.Timestamp}, nil
}

// parseRecord checks a message as the bridge publishes it (see streams/doc.go): the subject names the
// key, the body is the canonical FPM JSON, Fpm-Received-At-Ms is the observation time (the message's
// stream timestamp when the header is missing or unparsable), Fpm-Producer the producer id (default:
// the payload's worker_id). producerOverride, when set, replaces the producer id. meta (nil: jsMeta)
// supplies the stream sequence, delivery count and stream timestamp. An error means the message can
// never be written (bad subject or body): the caller terminates it.
func parseRecord(m jetstream.Msg, producerOverride string, meta metaOf) (record, error) {
	r := record{msg: m}
	if meta == nil {
		meta = jsMeta
	}
	md, merr := meta(m)
	if merr == nil {
		r.seq, r.delivered, r.stored = md.seq, md.delivered, md.stored
	}
	var err error
	if r.key, err = streams.ParseFPMSubject(m.Subject()); err != nil {
		return r, err
	}
	if r.fpm, err = checkFPM(m.Data()); err != nil {
		return r, fmt.Errorf("body: %w", err)
	}
	r.body = m.Data()
	h := m.Headers()
	r.observed = -1
	if v := h.Get(streams.HeaderReceivedAt); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
			r.observed = ms
		}
	}
	if r.observed < 0 {
		if merr != nil {
			return r, fmt.Errorf("no %s header and no stream metadata: %w", streams.HeaderReceivedAt, merr)
		}
		r.observed = max(r.stored.UnixMilli(), 0)
	}
	switch {
	case producerOverride != "":
		r.producer = producerOverride
	case h.Get(streams.HeaderProducer) != "":
		r.producer = h.Get(streams.HeaderProducer)
	default:
		r.producer = r.fpm.workerID
	}
	return r, nil
}

// appendLine appends r's trace line (no newline) to dst: timestamp is ms since the writer started,
// the fpm object is the message body, copied verbatim.
func appendLine(dst []byte, r *record, timestamp int64, mode string) []byte {
	l := schemas.TraceLine{
		Timestamp: timestamp,
		Event: schemas.TraceEvent{
			Schema: schemas.TraceSchema,
			Source: schemas.TraceSource{
				Namespace:  r.key.Namespace,
				Component:  r.key.Component,
				ProducerID: r.producer,
			},
			CaptureMode:      mode,
			ObservedAtUnixMs: r.observed,
			FPM:              r.body,
		},
	}
	return schemas.AppendTraceLine(dst, &l)
}
