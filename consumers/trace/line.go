package trace

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// delivery is one message as the writer sees it: what it reads, and how it says the message is done
// (its line, or the line that replaces it, is durable) or can never be written. *durable.Msg is one;
// a backfill's replayed messages have nothing to settle.
type delivery interface {
	Subject() string
	Data() []byte
	Headers() nats.Header
	Done()
	Reject(reason error)
}

// record is one message of the FPM stream, checked and ready to become a trace line.
type record struct {
	d        delivery
	key      streams.Key // from the subject: namespace, component, worker_id, dp_rank
	body     []byte      // the canonical FPM JSON, valid (checkFPM): the message body itself
	fpm      fpmIdent    // worker_id, dp_rank and counter_id of the body
	observed int64       // observed_at_unix_ms
	producer string      // producer id (unsanitized), as written in event.source.producer_id
	// From the JetStream metadata; zero when the message has none.
	seq    uint64    // stream sequence on FPM
	stored time.Time // stream timestamp
}

// msgMeta is what the writer needs from a message's JetStream metadata (zero: none).
type msgMeta struct {
	seq    uint64
	stored time.Time
}

// subjectKeys remembers the keys of the FPM subjects parsed so far: a stream has a few subjects per
// publisher, each seen many times, and parsing one (split, percent-decode, integer) costs more than
// looking it up. Bounded: it starts over past maxSubjectKeys. Owned by one goroutine; nil: no cache.
type subjectKeys map[string]streams.Key

const maxSubjectKeys = 1 << 16

func (c subjectKeys) parse(subject string) (streams.Key, error) {
	if c == nil {
		return streams.ParseFPMSubject(subject)
	}
	if k, ok := c[subject]; ok {
		return k, nil
	}
	k, err := streams.ParseFPMSubject(subject)
	if err != nil {
		return k, err
	}
	if len(c) >= maxSubjectKeys {
		clear(c)
	}
	c[subject] = k
	return k, nil
}

// parseRecord checks a message as the bridge publishes it (see streams/doc.go): the subject names the
// key, the body is the canonical FPM JSON, Fpm-Received-At-Ms is the observation time (the message's
// stream timestamp when the header is missing or unparsable), Fpm-Producer the producer id (default:
// the payload's worker_id). producerOverride, when set, replaces the producer id. keys (nil: none)
// caches subject keys. An error means the message can never be written (bad subject or body): the
// caller rejects it.
func parseRecord(d delivery, md msgMeta, producerOverride string, keys subjectKeys) (record, error) {
	r := record{d: d, seq: md.seq, stored: md.stored}
	var err error
	if r.key, err = keys.parse(d.Subject()); err != nil {
		return r, err
	}
	if r.fpm, err = checkFPM(d.Data()); err != nil {
		return r, fmt.Errorf("body: %w", err)
	}
	r.body = d.Data()
	h := d.Headers()
	r.observed = -1
	if v := h.Get(streams.HeaderReceivedAt); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
			r.observed = ms
		}
	}
	if r.observed < 0 {
		if r.stored.IsZero() {
			return r, fmt.Errorf("no %s header and no stream timestamp", streams.HeaderReceivedAt)
		}
		r.observed = max(r.stored.UnixMilli(), 0)
	}
	switch r.producer = producerOverride; {
	case r.producer != "":
	case h != nil:
		if r.producer = h.Get(streams.HeaderProducer); r.producer == "" {
			r.producer = r.fpm.workerID
		}
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
