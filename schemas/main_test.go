package schemas

import (
	"encoding/binary"
	"math"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The helpers below build msgpack by hand, byte by byte, independently of msgpack_encode.go, so tests
// compare the package against msgpack as msgspec writes it rather than against itself.

// mpKV is one map entry: a key and its already-encoded value.
type mpKV struct {
	k string
	v []byte
}

func mpCat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// mpStr encodes s as msgspec does (fixstr, str8, str16, str32).
func mpStr(s string) []byte {
	switch n := len(s); {
	case n < 32:
		return mpCat([]byte{0xa0 | byte(n)}, []byte(s))
	case n < 256:
		return mpCat([]byte{0xd9, byte(n)}, []byte(s))
	case n < 65536:
		return mpCat([]byte{0xda, byte(n >> 8), byte(n)}, []byte(s))
	}
	return mpCat([]byte{0xdb}, binary.BigEndian.AppendUint32(nil, uint32(len(s))), []byte(s))
}

func mpF64(f float64) []byte {
	return binary.BigEndian.AppendUint64([]byte{0xcb}, math.Float64bits(f))
}

func mpF32(f float32) []byte {
	return binary.BigEndian.AppendUint32([]byte{0xca}, math.Float32bits(f))
}

// mpMap encodes a map with string keys in the given order (fixmap or map16).
func mpMap(entries ...mpKV) []byte {
	var b []byte
	if n := len(entries); n < 16 {
		b = []byte{0x80 | byte(n)}
	} else {
		b = []byte{0xde, byte(n >> 8), byte(n)}
	}
	for _, e := range entries {
		b = append(b, mpStr(e.k)...)
		b = append(b, e.v...)
	}
	return b
}

// mpWith returns entries with key set to v (replaced in place, or appended).
func mpWith(entries []mpKV, key string, v []byte) []mpKV {
	out := append([]mpKV(nil), entries...)
	for i := range out {
		if out[i].k == key {
			out[i].v = v
			return out
		}
	}
	return append(out, mpKV{key, v})
}

// mpWithout returns entries without key.
func mpWithout(entries []mpKV, key string) []mpKV {
	var out []mpKV
	for _, e := range entries {
		if e.k != key {
			out = append(out, e)
		}
	}
	return out
}

// The example FPM of Dynamo's trace reference (worker 4192, counter 42), with the fields it leaves out filled in.
func goldenScheduled() []mpKV {
	return []mpKV{
		{"num_prefill_requests", []byte{0x02}},
		{"sum_prefill_tokens", []byte{0xcd, 0x01, 0x00}}, // 256: uint16
		{"var_prefill_length", mpF64(12.5)},
		{"sum_prefill_kv_tokens", []byte{0x40}}, // 64
		{"num_decode_requests", []byte{0x03}},
		{"sum_decode_kv_tokens", []byte{0xcd, 0x04, 0x00}}, // 1024
		{"var_decode_kv_tokens", mpF64(0)},
	}
}

func goldenQueued() []mpKV {
	return []mpKV{
		{"num_prefill_requests", []byte{0x01}},
		{"sum_prefill_tokens", []byte{0xcc, 0x80}}, // 128: uint8
		{"var_prefill_length", mpF64(0)},
		{"num_decode_requests", []byte{0x00}},
		{"sum_decode_kv_tokens", []byte{0x00}},
		{"var_decode_kv_tokens", mpF64(0)},
	}
}

func goldenTop(sched, queued []mpKV) []mpKV {
	return []mpKV{
		{"version", []byte{0x01}},
		{"worker_id", mpStr("4192")},
		{"dp_rank", []byte{0x00}},
		{"counter_id", []byte{0x2a}},
		{"wall_time", mpF64(0.025)},
		{"scheduled_requests", mpMap(sched...)},
		{"queued_requests", mpMap(queued...)},
	}
}

func goldenPayload() []byte {
	return mpMap(goldenTop(goldenScheduled(), goldenQueued())...)
}

const goldenJSON = `{"version":1,"worker_id":"4192","dp_rank":0,"counter_id":42,"wall_time":0.025,` +
	`"scheduled_requests":{"num_prefill_requests":2,"sum_prefill_tokens":256,"var_prefill_length":12.5,` +
	`"sum_prefill_kv_tokens":64,"num_decode_requests":3,"sum_decode_kv_tokens":1024,"var_decode_kv_tokens":0.0},` +
	`"queued_requests":{"num_prefill_requests":1,"sum_prefill_tokens":128,"var_prefill_length":0.0,` +
	`"num_decode_requests":0,"sum_decode_kv_tokens":0,"var_decode_kv_tokens":0.0}}`

var goldenFPM = FPM{
	Version: 1, WorkerID: "4192", DPRank: 0, CounterID: 42, WallTime: 0.025,
	Scheduled: ScheduledRequests{NumPrefillRequests: 2, SumPrefillTokens: 256, VarPrefillLength: 12.5,
		SumPrefillKVTokens: 64, NumDecodeRequests: 3, SumDecodeKVTokens: 1024},
	Queued: QueuedRequests{NumPrefillRequests: 1, SumPrefillTokens: 128},
}

// heartbeatPayload is an idle heartbeat as the publisher sends it: all zero but worker_id and dp_rank.
func heartbeatPayload() []byte {
	zero := func(entries []mpKV) []mpKV {
		out := append([]mpKV(nil), entries...)
		for i := range out {
			if out[i].k[:3] == "var" {
				out[i].v = mpF64(0)
			} else {
				out[i].v = []byte{0x00}
			}
		}
		return out
	}
	top := goldenTop(zero(goldenScheduled()), zero(goldenQueued()))
	top = mpWith(top, "worker_id", mpStr("worker-7"))
	top = mpWith(top, "dp_rank", []byte{0x03})
	top = mpWith(top, "counter_id", []byte{0xcd, 0x13, 0x88}) // 5000
	top = mpWith(top, "wall_time", mpF64(0))
	return mpMap(top...)
}

// fpmFields is the comparable part of an FPM: every typed field, not JSON.
type fpmFields struct {
	Version   int64
	WorkerID  string
	DPRank    int64
	CounterID int64
	WallTime  float64
	Scheduled ScheduledRequests
	Queued    QueuedRequests
}

// typedFields returns the typed fields of f, for comparisons.
func typedFields(f *FPM) fpmFields {
	return fpmFields{f.Version, f.WorkerID, f.DPRank, f.CounterID, f.WallTime, f.Scheduled, f.Queued}
}
