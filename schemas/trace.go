package schemas

import (
	"encoding/json"
	"math"
	"strconv"
)

// TraceSchema is the schema id of every trace line Dynamo's FPM trace writer emits.
const TraceSchema = "dynamo.fpm.trace.v1"

// Capture modes (DYN_FPM_MODE): sampled writes the newest payload per key every interval; full writes
// every valid payload, heartbeats included.
const (
	CaptureSampled = "sampled"
	CaptureFull    = "full"
)

// TraceLine is one line of a dynamo.fpm.trace.v1 gzip JSONL segment. Its JSON field order is the
// struct order, as Dynamo's serde structs write it.
type TraceLine struct {
	// Timestamp is milliseconds since the writer started.
	Timestamp int64      `json:"timestamp"`
	Event     TraceEvent `json:"event"`
}

// TraceEvent is the "event" object of a trace line.
type TraceEvent struct {
	// Schema is always TraceSchema.
	Schema string      `json:"schema"`
	Source TraceSource `json:"source"`
	// CaptureMode is CaptureSampled or CaptureFull.
	CaptureMode string `json:"capture_mode"`
	// ObservedAtUnixMs is the absolute observation time (fpmbus: the bridge's receive time).
	ObservedAtUnixMs int64 `json:"observed_at_unix_ms"`
	// FPM is the canonical FPM JSON object (FPM.JSON), copied verbatim.
	FPM json.RawMessage `json:"fpm"`
}

// TraceSource identifies the producer of a trace line.
type TraceSource struct {
	Namespace  string `json:"namespace"`
	Component  string `json:"component"`
	ProducerID string `json:"producer_id"`
}

// AppendTraceLine appends l as one compact JSON line, byte-identical to what Dynamo's trace writer
// (serde_json) writes: fields in struct order, strings escaped by appendJSONString, l.Event.FPM copied
// verbatim. It appends no newline; the segment writer adds '\n'.
//
// l.Event.FPM must be one compact JSON object (FPM.JSON is); it is not checked here. An empty FPM is
// written as null, as json.Marshal writes an empty RawMessage. Strings are expected to be valid UTF-8;
// invalid bytes are replaced by U+FFFD.
func AppendTraceLine(dst []byte, l *TraceLine) []byte {
	e := &l.Event
	dst = append(dst, `{"timestamp":`...)
	dst = strconv.AppendInt(dst, l.Timestamp, 10)
	dst = append(dst, `,"event":{"schema":`...)
	dst = appendJSONString(dst, e.Schema)
	dst = append(dst, `,"source":{"namespace":`...)
	dst = appendJSONString(dst, e.Source.Namespace)
	dst = append(dst, `,"component":`...)
	dst = appendJSONString(dst, e.Source.Component)
	dst = append(dst, `,"producer_id":`...)
	dst = appendJSONString(dst, e.Source.ProducerID)
	dst = append(dst, `},"capture_mode":`...)
	dst = appendJSONString(dst, e.CaptureMode)
	dst = append(dst, `,"observed_at_unix_ms":`...)
	dst = strconv.AppendInt(dst, e.ObservedAtUnixMs, 10)
	dst = append(dst, `,"fpm":`...)
	if len(e.FPM) == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, e.FPM...)
	}
	return append(dst, "}}"...)
}

// ParseTraceLine parses and checks one trace line (surrounding whitespace, such as the trailing
// newline, is allowed). It requires exactly the fields AppendTraceLine writes, no others: timestamp and
// observed_at_unix_ms non-negative integers, schema == TraceSchema, source's three fields strings,
// capture_mode sampled or full, and fpm an object that passes the FPM rules (as ParseFPMJSON).
//
// The returned line shares no memory with line; Event.FPM holds the fpm object's bytes as they appear
// in line. Errors are *traceLineError values naming the field (for example "event.capture_mode" or
// "event.fpm.queued_requests.num_decode_requests"), matching ErrInvalidTraceLine and, when the cause is a
// syntax or FPM rule error, errMalformed or ErrInvalid as well.
func ParseTraceLine(line []byte) (*TraceLine, error) {
	d := getDecoder(line)
	defer putDecoder(d)
	if err := d.parseJSON(); err != nil {
		var field, reason string
		if de, ok := err.(*decodeError); ok {
			field, reason = de.Field, "byte "+strconv.Itoa(de.Offset)+": "+de.Err.Error()
		}
		return nil, &traceLineError{Field: field, Reason: reason, Err: err}
	}
	out := new(TraceLine)
	t := traceWalker{&d.tree}

	var top [2]int
	if err := t.fields(0, "", []string{"timestamp", "event"}, top[:]); err != nil {
		return nil, err
	}
	var err error
	if out.Timestamp, err = t.integer(top[0], "timestamp"); err != nil {
		return nil, err
	}
	var ev [5]int
	if err := t.fields(top[1], "event", []string{"schema", "source", "capture_mode", "observed_at_unix_ms", "fpm"}, ev[:]); err != nil {
		return nil, err
	}
	e := &out.Event
	if e.Schema, err = t.str(ev[0], "event.schema"); err != nil {
		return nil, err
	}
	if e.Schema != TraceSchema {
		return nil, &traceLineError{Field: "event.schema", Reason: "unknown schema " + strconv.Quote(e.Schema) + ", want " + strconv.Quote(TraceSchema)}
	}
	var src [3]int
	if err := t.fields(ev[1], "event.source", []string{"namespace", "component", "producer_id"}, src[:]); err != nil {
		return nil, err
	}
	if e.Source.Namespace, err = t.str(src[0], "event.source.namespace"); err != nil {
		return nil, err
	}
	if e.Source.Component, err = t.str(src[1], "event.source.component"); err != nil {
		return nil, err
	}
	if e.Source.ProducerID, err = t.str(src[2], "event.source.producer_id"); err != nil {
		return nil, err
	}
	if e.CaptureMode, err = t.str(ev[2], "event.capture_mode"); err != nil {
		return nil, err
	}
	if e.CaptureMode != CaptureSampled && e.CaptureMode != CaptureFull {
		return nil, &traceLineError{Field: "event.capture_mode", Reason: "unknown capture mode " + strconv.Quote(e.CaptureMode) + `, want "sampled" or "full"`}
	}
	if e.ObservedAtUnixMs, err = t.integer(ev[3], "event.observed_at_unix_ms"); err != nil {
		return nil, err
	}
	fpm := &d.nodes[ev[4]]
	if fpm.kind != kindMap {
		return nil, &traceLineError{Field: "event.fpm", Reason: "not an object (got " + fpm.kind.String() + ")"}
	}
	var f FPM
	if err := validateFPM(&d.tree, ev[4], &f); err != nil {
		ve := err.(*validationError)
		return nil, &traceLineError{Field: joinField("event.fpm", ve.Field), Reason: ve.Reason, Err: err}
	}
	e.FPM = append(json.RawMessage(nil), d.raw(fpm)...)
	return out, nil
}

// traceWalker reads the envelope fields of a parsed trace line.
type traceWalker struct {
	*tree
}

// fields checks that nodes[m] is an object holding exactly names and sets out[j] to the value index of
// names[j].
func (t *traceWalker) fields(m int, field string, names []string, out []int) error {
	n := &t.nodes[m]
	if n.kind != kindMap {
		return &traceLineError{Field: field, Reason: "not an object (got " + n.kind.String() + ")"}
	}
	lookup(t.tree, m, names, out)
	for j, i := range out {
		if i < 0 {
			return &traceLineError{Field: joinField(field, names[j]), Reason: "missing"}
		}
	}
	if int(n.count) != len(names) {
		for k := m + 1; k < int(n.end); k = int(t.nodes[k+1].end) {
			known := false
			for _, name := range names {
				if string(t.raw(&t.nodes[k])) == name {
					known = true
					break
				}
			}
			if !known {
				key := string(t.raw(&t.nodes[k]))
				return &traceLineError{Field: joinField(field, key), Reason: "unknown field"}
			}
		}
	}
	return nil
}

func (t *traceWalker) integer(i int, field string) (int64, error) {
	n := &t.nodes[i]
	switch n.kind {
	case kindInt:
		if n.int64() < 0 {
			return 0, &traceLineError{Field: field, Reason: "negative integer " + strconv.FormatInt(n.int64(), 10)}
		}
		return n.int64(), nil
	case kindUint, kindBigInt:
		return 0, &traceLineError{Field: field, Reason: "integer out of range (max " + strconv.FormatInt(math.MaxInt64, 10) + ")"}
	}
	return 0, &traceLineError{Field: field, Reason: gotKind("an integer", n)}
}

func (t *traceWalker) str(i int, field string) (string, error) {
	n := &t.nodes[i]
	if n.kind != kindStr {
		return "", &traceLineError{Field: field, Reason: gotKind("a string", n)}
	}
	return string(t.raw(n)), nil
}
