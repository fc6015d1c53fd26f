package schemas

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// The FPM rules, as Dynamo's Rust trace validator (lib/llm/src/fpm_trace/sink.rs) applies them to a
// decoded payload, made stricter only where a typed FPM needs it:
//
//   - the payload is a map;
//   - every field is present: version, worker_id, dp_rank, counter_id, wall_time, scheduled_requests
//     (7 fields) and queued_requests (6 fields);
//   - version is the integer 1;
//   - worker_id is a string;
//   - dp_rank, counter_id and every request count are integers >= 0 that fit an int64 (a float such as
//     1.0 is not an integer);
//   - wall_time and the two variances are finite numbers >= 0 (an integer is a number; -0.0 passes);
//   - any other field, at the top level or inside the two request maps, is allowed and kept as it is.
//
// Fields are checked in the order above and the first problem is reported.

// Field names of Dynamo's ForwardPassMetrics, in msgspec encoding order.
const (
	fieldVersion           = "version"
	fieldWorkerID          = "worker_id"
	fieldDPRank            = "dp_rank"
	fieldCounterID         = "counter_id"
	fieldWallTime          = "wall_time"
	fieldScheduled         = "scheduled_requests"
	fieldQueued            = "queued_requests"
	fieldNumPrefill        = "num_prefill_requests"
	fieldSumPrefillTokens  = "sum_prefill_tokens"
	fieldVarPrefillLength  = "var_prefill_length"
	fieldSumPrefillKV      = "sum_prefill_kv_tokens"
	fieldNumDecode         = "num_decode_requests"
	fieldSumDecodeKV       = "sum_decode_kv_tokens"
	fieldVarDecodeKVTokens = "var_decode_kv_tokens"
)

var (
	topFields       = [...]string{fieldVersion, fieldWorkerID, fieldDPRank, fieldCounterID, fieldWallTime, fieldScheduled, fieldQueued}
	scheduledFields = [...]string{fieldNumPrefill, fieldSumPrefillTokens, fieldVarPrefillLength, fieldSumPrefillKV, fieldNumDecode, fieldSumDecodeKV, fieldVarDecodeKVTokens}
	queuedFields    = [...]string{fieldNumPrefill, fieldSumPrefillTokens, fieldVarPrefillLength, fieldNumDecode, fieldSumDecodeKV, fieldVarDecodeKVTokens}
)

// lookup sets out[j] to the node index of the value of names[j] in the map at t.nodes[m], or -1. Keys are
// unique (the parsers reject duplicates).
func lookup(t *tree, m int, names []string, out []int) {
	nodes := t.nodes
	for j := range out {
		out[j] = -1
	}
	for k := m + 1; k < int(nodes[m].end); k = int(nodes[k+1].end) {
		key := t.raw(&nodes[k])
		for j, name := range names {
			if out[j] < 0 && string(key) == name {
				out[j] = k + 1
				break
			}
		}
	}
}

// validator checks the fields of one FPM tree.
type validator struct {
	*tree
}

func invalid(field, reason string) *validationError {
	return &validationError{Field: field, Reason: reason}
}

func gotKind(want string, n *node) string {
	return "not " + want + " (got " + n.kind.String() + ")"
}

// integer checks a non-negative int64 field.
func (v *validator) integer(i int, field string) (int64, error) {
	if i < 0 {
		return 0, invalid(field, "missing")
	}
	n := &v.nodes[i]
	switch n.kind {
	case kindInt:
		if x := n.int64(); x < 0 {
			return 0, invalid(field, "negative integer "+strconv.FormatInt(x, 10))
		}
		return n.int64(), nil
	case kindUint:
		return 0, invalid(field, "integer "+strconv.FormatUint(n.uint64(), 10)+" out of range (max 9223372036854775807)")
	case kindBigInt:
		if lit := v.raw(n); lit[0] == '-' {
			return 0, invalid(field, "negative integer "+string(lit))
		}
		return 0, invalid(field, "integer "+string(v.raw(n))+" out of range (max 9223372036854775807)")
	}
	return 0, invalid(field, gotKind("an integer", n))
}

// number checks a finite, non-negative number field; an integer is accepted.
func (v *validator) number(i int, field string) (float64, error) {
	if i < 0 {
		return 0, invalid(field, "missing")
	}
	n := &v.nodes[i]
	if !n.isNumber() {
		return 0, invalid(field, gotKind("a number", n))
	}
	x := v.numberOf(n)
	if reason := checkNumber(x); reason != "" {
		return 0, invalid(field, reason)
	}
	return x, nil
}

// checkNumber returns why x is not a finite number >= 0, or "".
func checkNumber(x float64) string {
	switch {
	case math.IsNaN(x):
		return "not finite (NaN)"
	case math.IsInf(x, 1):
		return "not finite (+Inf)"
	case math.IsInf(x, -1):
		return "not finite (-Inf)"
	case x < 0:
		return "negative number " + string(appendJSONFloat(nil, x))
	}
	return ""
}

// requestMap checks that nodes[i] is a map and returns it.
func (v *validator) requestMap(i int, field string) error {
	if i < 0 {
		return invalid(field, "missing")
	}
	if n := &v.nodes[i]; n.kind != kindMap {
		return invalid(field, gotKind("a map", n))
	}
	return nil
}

// Error paths of the request maps' fields, by field index: scheduled_requests.<field>, ...
var (
	scheduledPaths = requestPaths(fieldScheduled, scheduledFields[:])
	queuedPaths    = requestPaths(fieldQueued, queuedFields[:])
)

func requestPaths(m string, fields []string) []string {
	out := make([]string, len(fields))
	for j, f := range fields {
		out[j] = m + "." + f
	}
	return out
}

// requests checks the request map at node i (the top-level field name) and reads its fields into r
// by index, as the fast paths do: fields are its names, the numbers among them are flagged in floats
// (scheduledFloats, queuedFloats), the rest are counts; paths name them in errors. Fields are checked
// in declaration order, so the first bad one is reported.
func (v *validator) requests(i int, name string, fields, paths []string, floats uint, r *requestValues) error {
	if err := v.requestMap(i, name); err != nil {
		return err
	}
	var at [len(scheduledFields)]int
	lookup(v.tree, i, fields, at[:len(fields)])
	for j := range fields {
		var err error
		if floats&(1<<j) != 0 {
			r.floats[j], err = v.number(at[j], paths[j])
		} else {
			r.ints[j], err = v.integer(at[j], paths[j])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// validateFPM checks the FPM map at t.nodes[root] and fills the typed fields of f (not f.JSON). Field
// paths in errors are relative to the FPM object.
func validateFPM(t *tree, root int, f *FPM) error {
	v := validator{t}
	nodes := t.nodes
	if n := &nodes[root]; n.kind != kindMap {
		return invalid("", gotKind("a map", n))
	}
	var top [len(topFields)]int
	lookup(t, root, topFields[:], top[:])

	// version
	i := top[0]
	if i < 0 {
		return invalid(fieldVersion, "missing")
	}
	switch n := &nodes[i]; n.kind {
	case kindInt:
		if n.int64() != FPMVersion {
			return invalid(fieldVersion, "unsupported version "+strconv.FormatInt(n.int64(), 10)+", want 1")
		}
	case kindUint:
		return invalid(fieldVersion, "unsupported version "+strconv.FormatUint(n.uint64(), 10)+", want 1")
	case kindBigInt:
		return invalid(fieldVersion, "unsupported version "+string(t.raw(n))+", want 1")
	default:
		return invalid(fieldVersion, gotKind("an integer", n))
	}
	f.Version = FPMVersion

	// worker_id
	if i = top[1]; i < 0 {
		return invalid(fieldWorkerID, "missing")
	}
	if n := &nodes[i]; n.kind != kindStr {
		return invalid(fieldWorkerID, gotKind("a string", n))
	}
	workerID := t.raw(&nodes[i])

	var err error
	if f.DPRank, err = v.integer(top[2], fieldDPRank); err != nil {
		return err
	}
	if f.CounterID, err = v.integer(top[3], fieldCounterID); err != nil {
		return err
	}
	if f.WallTime, err = v.number(top[4], fieldWallTime); err != nil {
		return err
	}

	// scheduled_requests, queued_requests
	var sched, queued requestValues
	if err = v.requests(top[5], fieldScheduled, scheduledFields[:], scheduledPaths, scheduledFloats, &sched); err != nil {
		return err
	}
	f.Scheduled = sched.scheduled()
	if err = v.requests(top[6], fieldQueued, queuedFields[:], queuedPaths, queuedFloats, &queued); err != nil {
		return err
	}
	f.Queued = queued.queued()

	f.WorkerID = string(workerID)
	return nil
}

// Validate checks the typed fields of f against the same rules DecodeFPM applies (version 1, counts
// >= 0, wall_time and variances finite and >= 0, worker_id valid UTF-8). It does not look at f.JSON. Producers call it before
// EncodeMsgpack; a *FPM returned by DecodeFPM or ParseFPMJSON always passes it.
func (f *FPM) Validate() error {
	if f.Version != FPMVersion {
		return invalid(fieldVersion, "unsupported version "+strconv.FormatInt(f.Version, 10)+", want 1")
	}
	if !utf8.ValidString(f.WorkerID) {
		return invalid(fieldWorkerID, "invalid UTF-8")
	}
	const sp, qp = fieldScheduled + ".", fieldQueued + "."
	checks := [...]struct {
		field   string
		i       int64
		f       float64
		isFloat bool
	}{
		{field: fieldDPRank, i: f.DPRank},
		{field: fieldCounterID, i: f.CounterID},
		{field: fieldWallTime, f: f.WallTime, isFloat: true},
		{field: sp + fieldNumPrefill, i: f.Scheduled.NumPrefillRequests},
		{field: sp + fieldSumPrefillTokens, i: f.Scheduled.SumPrefillTokens},
		{field: sp + fieldVarPrefillLength, f: f.Scheduled.VarPrefillLength, isFloat: true},
		{field: sp + fieldSumPrefillKV, i: f.Scheduled.SumPrefillKVTokens},
		{field: sp + fieldNumDecode, i: f.Scheduled.NumDecodeRequests},
		{field: sp + fieldSumDecodeKV, i: f.Scheduled.SumDecodeKVTokens},
		{field: sp + fieldVarDecodeKVTokens, f: f.Scheduled.VarDecodeKVTokens, isFloat: true},
		{field: qp + fieldNumPrefill, i: f.Queued.NumPrefillRequests},
		{field: qp + fieldSumPrefillTokens, i: f.Queued.SumPrefillTokens},
		{field: qp + fieldVarPrefillLength, f: f.Queued.VarPrefillLength, isFloat: true},
		{field: qp + fieldNumDecode, i: f.Queued.NumDecodeRequests},
		{field: qp + fieldSumDecodeKV, i: f.Queued.SumDecodeKVTokens},
		{field: qp + fieldVarDecodeKVTokens, f: f.Queued.VarDecodeKVTokens, isFloat: true},
	}
	for _, c := range checks {
		if c.isFloat {
			if reason := checkNumber(c.f); reason != "" {
				return invalid(c.field, reason)
			}
		} else if c.i < 0 {
			return invalid(c.field, "negative integer "+strconv.FormatInt(c.i, 10))
		}
	}
	return nil
}
