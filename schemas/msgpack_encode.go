package schemas

import (
	"encoding/binary"
	"math"
)

// EncodeMsgpack encodes f exactly as Python's msgspec.msgpack.Encoder encodes Dynamo's ForwardPassMetrics
// struct (what the synthetic publisher sends in place of a real worker). f.JSON is ignored, so unknown
// fields are not encoded. f is not validated: call f.Validate first if it may break the FPM rules.
func EncodeMsgpack(f *FPM) []byte {
	return AppendMsgpack(make([]byte, 0, 320), f)
}

// AppendMsgpack appends the msgpack encoding of f to dst and returns the extended buffer (see
// EncodeMsgpack). The layout is msgspec's for a struct without array_like, tag or omit_defaults:
//
//   - a map of the 7 fields in declaration order (version, worker_id, dp_rank, counter_id, wall_time,
//     scheduled_requests, queued_requests), the nested ones maps of 7 and 6 fields, keys as fixstr;
//   - integers in the smallest encoding: positive fixint, uint8/16/32/64 when non-negative, negative
//     fixint, int8/16/32/64 when negative;
//   - floats always float64 (0xcb), even when integral;
//   - strings as fixstr, str8, str16 or str32 by length.
func AppendMsgpack(dst []byte, f *FPM) []byte {
	dst = append(dst, 0x87)
	dst = appendIntField(dst, fieldVersion, f.Version)
	dst = appendKey(dst, fieldWorkerID)
	dst = AppendMsgpackStr(dst, f.WorkerID)
	dst = appendIntField(dst, fieldDPRank, f.DPRank)
	dst = appendIntField(dst, fieldCounterID, f.CounterID)
	dst = appendFloatField(dst, fieldWallTime, f.WallTime)

	s := &f.Scheduled
	dst = append(appendKey(dst, fieldScheduled), 0x87)
	dst = appendPrefill(dst, s.NumPrefillRequests, s.SumPrefillTokens, s.VarPrefillLength)
	dst = appendIntField(dst, fieldSumPrefillKV, s.SumPrefillKVTokens)
	dst = appendDecode(dst, s.NumDecodeRequests, s.SumDecodeKVTokens, s.VarDecodeKVTokens)

	q := &f.Queued // the scheduled fields but sum_prefill_kv_tokens
	dst = append(appendKey(dst, fieldQueued), 0x86)
	dst = appendPrefill(dst, q.NumPrefillRequests, q.SumPrefillTokens, q.VarPrefillLength)
	return appendDecode(dst, q.NumDecodeRequests, q.SumDecodeKVTokens, q.VarDecodeKVTokens)
}

// appendPrefill appends the three prefill fields scheduled and queued requests both have.
func appendPrefill(dst []byte, num, sumTokens int64, varLength float64) []byte {
	dst = appendIntField(dst, fieldNumPrefill, num)
	dst = appendIntField(dst, fieldSumPrefillTokens, sumTokens)
	return appendFloatField(dst, fieldVarPrefillLength, varLength)
}

// appendDecode appends the three decode fields scheduled and queued requests both have.
func appendDecode(dst []byte, num, sumKV int64, varKV float64) []byte {
	dst = appendIntField(dst, fieldNumDecode, num)
	dst = appendIntField(dst, fieldSumDecodeKV, sumKV)
	return appendFloatField(dst, fieldVarDecodeKVTokens, varKV)
}

// appendIntField appends field k with the integer value v.
func appendIntField(dst []byte, k string, v int64) []byte {
	return AppendMsgpackInt(appendKey(dst, k), v)
}

// appendFloatField appends field k with the float value v.
func appendFloatField(dst []byte, k string, v float64) []byte {
	return AppendMsgpackFloat(appendKey(dst, k), v)
}

// appendKey appends a field name (always shorter than 32 bytes) as a fixstr.
func appendKey(dst []byte, k string) []byte {
	dst = append(dst, 0xa0|byte(len(k)))
	return append(dst, k...)
}

// The msgpack writers below use msgspec's choice of encodings, so that what fpmbus encodes (the
// synthetic publisher's FPMs, a replay's transcoded records) is byte for byte what Dynamo sends: the
// smallest integer form, float64 always, the shortest string header.

// AppendMsgpackStr appends s as a fixstr, str8, str16 or str32 by its length.
func AppendMsgpackStr(dst []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, 0xda), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

// AppendMsgpackUint appends u as a positive fixint or a uint8/16/32/64, whichever is smallest.
func AppendMsgpackUint(dst []byte, u uint64) []byte {
	switch {
	case u < 128:
		return append(dst, byte(u))
	case u <= math.MaxUint8:
		return append(dst, 0xcc, byte(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, 0xcd), uint16(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(u))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), u)
}

// AppendMsgpackInt appends v in the smallest encoding msgspec uses for a Python int: as
// AppendMsgpackUint when non-negative, else a negative fixint or an int8/16/32/64.
func AppendMsgpackInt(dst []byte, v int64) []byte {
	if v >= 0 {
		return AppendMsgpackUint(dst, uint64(v))
	}
	switch {
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, 0xd1), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

// AppendMsgpackFloat appends f as a float64 (0xcb), even when it is integral.
func AppendMsgpackFloat(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}
