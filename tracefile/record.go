package tracefile

import (
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fpmbus/fpmbus/schemas"
	"github.com/fpmbus/fpmbus/streams"
)

// Message is a message of the FPM stream as a trace's writer and its verifier read it. *durable.Msg
// and jetstream.Msg are Messages.
type Message interface {
	Subject() string
	Data() []byte
	Headers() nats.Header
}

// Record is one message of the FPM stream, checked and ready to become a trace line: what its line
// holds, and where the message is in the stream.
type Record struct {
	Key      streams.Key // from the subject: namespace, component, worker_id, dp_rank
	Body     []byte      // the canonical FPM JSON, valid (CheckFPM): the message body itself
	FPM      fpmIdent    // worker_id, dp_rank and counter_id of the body
	Observed int64       // observed_at_unix_ms
	Producer string      // producer id (unsanitized), as written in event.source.producer_id
	// From the JetStream metadata; zero when the message has none.
	Seq    uint64    // stream sequence on FPM
	Stored time.Time // stream timestamp
}

// MsgMeta is what a line needs from a message's JetStream metadata (zero: none).
type MsgMeta struct {
	Seq    uint64
	Stored time.Time
}

// SubjectKeys remembers the keys of the FPM subjects parsed so far: a stream has a few subjects per
// publisher, each seen many times, and parsing one (split, percent-decode, integer) costs more than
// looking it up. Bounded: it starts over past maxSubjectKeys. Owned by one goroutine; nil: no cache.
type SubjectKeys map[string]streams.Key

const maxSubjectKeys = 1 << 16

func (c SubjectKeys) parse(subject string) (streams.Key, error) {
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

// ParseRecord checks a message as the bridge publishes it (see streams/doc.go): the subject names the
// key, the body is the canonical FPM JSON, Fpm-Received-At-Ms is the observation time (the message's
// stream timestamp when the header is missing or unparsable), Fpm-Producer the producer id (default:
// the payload's worker_id). producerOverride, when set, replaces the producer id. keys (nil: none)
// caches subject keys. An error means the message can never be written (bad subject or body): the
// caller rejects it.
func ParseRecord(d Message, md MsgMeta, producerOverride string, keys SubjectKeys) (Record, error) {
	r := Record{Seq: md.Seq, Stored: md.Stored}
	var err error
	if r.Key, err = keys.parse(d.Subject()); err != nil {
		return r, err
	}
	if r.FPM, err = CheckFPM(d.Data()); err != nil {
		return r, fmt.Errorf("body: %w", err)
	}
	r.Body = d.Data()
	h := d.Headers()
	r.Observed = -1
	if v := h.Get(streams.HeaderReceivedAt); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
			r.Observed = ms
		}
	}
	if r.Observed < 0 {
		if r.Stored.IsZero() {
			return r, fmt.Errorf("no %s header and no stream timestamp", streams.HeaderReceivedAt)
		}
		r.Observed = max(r.Stored.UnixMilli(), 0)
	}
	switch r.Producer = producerOverride; {
	case r.Producer != "":
	case h != nil:
		if r.Producer = h.Get(streams.HeaderProducer); r.Producer == "" {
			r.Producer = r.FPM.WorkerID
		}
	default:
		r.Producer = r.FPM.WorkerID
	}
	return r, nil
}

// AppendLine appends r's trace line (no newline) to dst: timestamp is ms since the writer started,
// the fpm object is the message body, copied verbatim.
func AppendLine(dst []byte, r *Record, timestamp int64, mode string) []byte {
	l := schemas.TraceLine{
		Timestamp: timestamp,
		Event: schemas.TraceEvent{
			Schema: schemas.TraceSchema,
			Source: schemas.TraceSource{
				Namespace:  r.Key.Namespace,
				Component:  r.Key.Component,
				ProducerID: r.Producer,
			},
			CaptureMode:      mode,
			ObservedAtUnixMs: r.Observed,
			FPM:              r.Body,
		},
	}
	return schemas.AppendTraceLine(dst, &l)
}
