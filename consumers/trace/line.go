package trace

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// record is one message of the FPM stream, checked and ready to become a trace line.
type record struct {
	msg      jetstream.Msg
	key      streams.Key  // from the subject: namespace, component, worker_id, dp_rank
	fpm      *schemas.FPM // validated; fpm.JSON is the message body itself
	observed int64        // observed_at_unix_ms
	producer string       // producer id (unsanitized), as written in event.source.producer_id
}

// parseRecord checks a message as the bridge publishes it (see streams/doc.go): the subject names the
// key, the body is the canonical FPM JSON, Fpm-Received-At-Ms is the observation time (the message's
// stream timestamp when the header is missing or unparsable), Fpm-Producer the producer id (default:
// the payload's worker_id). producerOverride, when set, replaces the producer id. An error means the
// message can never be written (bad subject or body): the caller terminates it.
func parseRecord(m jetstream.Msg, producerOverride string) (record, error) {
	r := record{msg: m}
	var err error
	if r.key, err = streams.ParseFPMSubject(m.Subject()); err != nil {
		return r, err
	}
	if r.fpm, err = schemas.ParseFPMJSON(m.Data()); err != nil {
		return r, fmt.Errorf("body: %w", err)
	}
	h := m.Headers()
	r.observed = -1
	if v := h.Get(streams.HeaderReceivedAt); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
			r.observed = ms
		}
	}
	if r.observed < 0 {
		md, err := m.Metadata()
		if err != nil {
			return r, fmt.Errorf("no %s header and no stream metadata: %w", streams.HeaderReceivedAt, err)
		}
		r.observed = max(md.Timestamp.UnixMilli(), 0)
	}
	switch {
	case producerOverride != "":
		r.producer = producerOverride
	case h.Get(streams.HeaderProducer) != "":
		r.producer = h.Get(streams.HeaderProducer)
	default:
		r.producer = r.fpm.WorkerID
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
			FPM:              r.fpm.JSON,
		},
	}
	return schemas.AppendTraceLine(dst, &l)
}
