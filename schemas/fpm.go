// Package schemas holds the Go types and JSON Schema documents of every wire and file format fpmbus
// reads or writes: Dynamo's ForwardPassMetrics (msgpack on ZMQ, canonical JSON on NATS) and the
// dynamo.fpm.trace.v1 trace line.
//
// Invariants: a *FPM returned by DecodeFPM or ParseFPMJSON (or filled by Decoder or appendDecodeFPM) has
// passed the FPM rules (see validate.go; FPM.Validate checks the typed fields by the same rules), and its
// JSON field holds the canonical JSON object — every field of the payload, unknown ones too, in payload
// order, floats formatted as Dynamo's Rust trace writer (serde_json/ryu) formats them. Consumers copy
// JSON verbatim.
//
// One file per concept: msgpack.go (strict msgpack reader), json_parse.go (strict JSON reader into the
// same tree), validate.go (the FPM rules), canonical_json.go (the canonical JSON writer and serde_json
// float/string formatting), decode.go (DecodeFPM, ParseFPMJSON), fastpath.go (their one-pass fast paths
// for the common shape, and the allocation-free Decoder and appendDecodeFPM), msgpack_encode.go
// (msgspec-identical encoder), trace.go (the trace line; the trace's files, their names and read order
// are tracefile's), jsonschema.go (the embedded JSON Schema documents), errors.go.
package schemas

// FPMVersion is the only ForwardPassMetrics version Dynamo accepts.
const FPMVersion = 1

// FPM is one decoded, validated ForwardPassMetrics message.
type FPM struct {
	Version   int64
	WorkerID  string
	DPRank    int64
	CounterID int64
	WallTime  float64
	Scheduled ScheduledRequests
	Queued    QueuedRequests
	// JSON is the canonical JSON object (compact, payload order, unknown fields kept).
	JSON []byte
}

// ScheduledRequests mirrors Dynamo's ScheduledRequestMetrics (7 fields, in this order).
type ScheduledRequests struct {
	NumPrefillRequests int64
	SumPrefillTokens   int64
	VarPrefillLength   float64
	SumPrefillKVTokens int64
	NumDecodeRequests  int64
	SumDecodeKVTokens  int64
	VarDecodeKVTokens  float64
}

// QueuedRequests mirrors Dynamo's QueuedRequestMetrics (6 fields, in this order).
type QueuedRequests struct {
	NumPrefillRequests int64
	SumPrefillTokens   int64
	VarPrefillLength   float64
	NumDecodeRequests  int64
	SumDecodeKVTokens  int64
	VarDecodeKVTokens  float64
}

// IsHeartbeat reports whether f is an idle heartbeat: wall_time 0 and every request count zero.
func (f *FPM) IsHeartbeat() bool {
	return f.WallTime == 0 && f.Scheduled == (ScheduledRequests{}) && f.Queued == (QueuedRequests{})
}
