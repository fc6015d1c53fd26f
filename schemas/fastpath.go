package schemas

import (
	"encoding/binary"
	"math"
	"strconv"
	"sync"
	"unicode/utf8"
)

// Fast paths of DecodeFPM and ParseFPMJSON for the shape nearly every message has: an FPM map holding
// exactly the 7 known fields, its two request maps exactly their 7 and 6 known fields (each key once,
// in any order), every value of a type the FPM rules accept and within their limits. One pass over the
// input checks all of that, fills the typed fields and (msgpack) writes the canonical JSON as it goes,
// without building a tree.
//
// A fast path only ever accepts: on anything it does not recognise — an unknown field, a missing or
// repeated one, another encoding (map16 for the FPM map, str8 keys, JSON whitespace or escapes, a
// negative number), a value breaking a rule, malformed input — it reports !ok and the caller runs the
// general path (msgpack.go or json_parse.go, then validate.go and canonical_json.go) from the start,
// so every error, and every unusual document, is handled by that path alone. What a fast path accepts,
// the general path accepts with the same typed fields and the same JSON bytes;
// FuzzDecodeFPMFastMatchesReference and FuzzParseFPMJSONFastMatchesReference check it.

// Decoder holds reusable state for decoding many FPMs on one goroutine: a scratch buffer for the
// canonical JSON and the last worker_id, which is reused (not allocated again) while messages keep
// carrying the same one. The zero value is ready to use. A Decoder is not safe for concurrent use; give
// each reader goroutine its own.
type Decoder struct {
	buf      []byte // canonical JSON scratch
	workerID string // the worker_id of the last message decoded
}

// DecodeFPM is DecodeFPM writing into *f: same validation, same errors, same typed fields and JSON
// bytes. f.JSON is a new slice of exactly the JSON's length, owned by the caller (for the common
// shape that is the only allocation: f.WorkerID reuses the previous message's string when the
// worker_id is unchanged). On error *f is unchanged.
func (d *Decoder) DecodeFPM(payload []byte, f *FPM) error {
	var g FPM
	out, wid, ok := appendFPMMsgpackFast(d.buf[:0], payload, &g)
	if ok {
		d.buf = out
		g.WorkerID = d.intern(wid)
		g.JSON = append(make([]byte, 0, len(out)), out...)
		*f = g
		return nil
	}
	g = FPM{}
	var err error
	if out, err = appendDecodeFPMGeneral(d.buf[:0], payload, &g); err != nil {
		return err
	}
	d.buf = out
	d.workerID = g.WorkerID
	g.JSON = append(make([]byte, 0, len(out)), out...)
	*f = g
	return nil
}

// ParseFPMJSON is ParseFPMJSON writing into *f: same validation, same errors, same typed fields;
// f.JSON is body itself. For the canonical form it allocates nothing (f.WorkerID reuses the previous
// message's string when the worker_id is unchanged). On error *f is unchanged.
func (d *Decoder) ParseFPMJSON(body []byte, f *FPM) error {
	var g FPM
	if wid, ok := parseFPMJSONFast(body, &g); ok {
		g.WorkerID = d.intern(wid)
		g.JSON = body
		*f = g
		return nil
	}
	g = FPM{}
	if err := parseFPMJSONGeneral(body, &g); err != nil {
		return err
	}
	d.workerID = g.WorkerID
	g.JSON = body
	*f = g
	return nil
}

// intern returns b as a string, reusing the last one when it holds the same text.
func (d *Decoder) intern(b []byte) string {
	if string(b) != d.workerID {
		d.workerID = string(b)
	}
	return d.workerID
}

// appendDecodeFPM is DecodeFPM appending the canonical JSON to dst: it validates payload exactly as
// DecodeFPM does (same errors), fills the typed fields of *f, appends the JSON to dst and returns the
// extended buffer, with f.JSON set to the appended bytes (aliasing the returned buffer, capacity
// clipped, so appending to f.JSON never overwrites what follows). When f.WorkerID already holds the
// payload's worker_id it is kept; so decoding into the same *f with a reused dst allocates nothing for
// the common shape. On error it returns dst unchanged in length (bytes past it may have been
// written) and leaves *f unchanged. dst must not overlap payload.
func appendDecodeFPM(dst, payload []byte, f *FPM) ([]byte, error) {
	var g FPM
	start := len(dst)
	out, wid, ok := appendFPMMsgpackFast(dst, payload, &g)
	if ok {
		if string(wid) == f.WorkerID {
			g.WorkerID = f.WorkerID
		} else {
			g.WorkerID = string(wid)
		}
	} else {
		g = FPM{}
		var err error
		if out, err = appendDecodeFPMGeneral(dst, payload, &g); err != nil {
			return dst, err
		}
	}
	g.JSON = out[start:len(out):len(out)]
	*f = g
	return out, nil
}

// decoderCache holds the Decoders behind DecodeFPM and ParseFPMJSON, so that their scratch buffers
// and last worker_id are reused across calls.
var decoderCache = sync.Pool{New: func() any { return new(Decoder) }}

func getFastDecoder() *Decoder { return decoderCache.Get().(*Decoder) }

func putFastDecoder(d *Decoder) {
	if cap(d.buf) > 64<<10 {
		d.buf = nil
	}
	decoderCache.Put(d)
}

// appendDecodeFPMGeneral is the general path of DecodeFPM (the tree): it fills f's typed fields and
// appends the canonical JSON to dst.
func appendDecodeFPMGeneral(dst, payload []byte, f *FPM) ([]byte, error) {
	d := getDecoder(payload)
	defer putDecoder(d)
	if err := d.parseMsgpack(); err != nil {
		return dst, err
	}
	if err := validateFPM(&d.tree, 0, f); err != nil {
		return dst, err
	}
	dst, _ = appendCanonical(dst, &d.tree, 0)
	return dst, nil
}

// parseFPMJSONGeneral is the general path of ParseFPMJSON (the tree): it fills f's typed fields.
func parseFPMJSONGeneral(body []byte, f *FPM) error {
	d := getDecoder(body)
	defer putDecoder(d)
	if err := d.parseJSON(); err != nil {
		return err
	}
	return validateFPM(&d.tree, 0, f)
}

// Field indices of the fast paths: the position of a field in topFields, scheduledFields or
// queuedFields.
const (
	topVersion = iota
	topWorkerID
	topDPRank
	topCounterID
	topWallTime
	topScheduled
	topQueued
)

// fastNames holds, for one map of the fast paths, its field names in declaration order and for each
// name its msgpack fixstr encoding and its JSON key with the separator before it (`,"name":`).
type fastNames struct {
	names   []string
	mpKeys  []string
	jsonKey []string
}

func newFastNames(names []string) *fastNames {
	n := &fastNames{names: names}
	for _, name := range names {
		n.mpKeys = append(n.mpKeys, string([]byte{0xa0 | byte(len(name))})+name)
		n.jsonKey = append(n.jsonKey, `,"`+name+`":`)
	}
	return n
}

var (
	topNames       = newFastNames(topFields[:])
	scheduledNames = newFastNames(scheduledFields[:])
	queuedNames    = newFastNames(queuedFields[:])
)

// mpField reads the fixstr key at p, which must be one of n's names, and returns the name's index and
// the offset after the key, or next 0. Fields usually come in declaration order, so the name at hint is
// tried first.
func (n *fastNames) mpField(src []byte, p, hint int) (id, next int) {
	rest := src[p:]
	if k := n.mpKeys[hint]; len(rest) >= len(k) && string(rest[:len(k)]) == k {
		return hint, p + len(k)
	}
	for j, k := range n.mpKeys {
		if len(rest) >= len(k) && string(rest[:len(k)]) == k {
			return j, p + len(k)
		}
	}
	return -1, 0
}

// appendJSONKey appends the JSON key of field id, with a comma before it unless it is the i'th field
// written and i is 0.
func (n *fastNames) appendJSONKey(dst []byte, id, i int) []byte {
	k := n.jsonKey[id]
	if i == 0 {
		k = k[1:]
	}
	return append(dst, k...)
}

// Kinds of request fields: which of scheduledFields / queuedFields are numbers (the rest are counts).
const (
	scheduledFloats = 1<<2 | 1<<6 // var_prefill_length, var_decode_kv_tokens
	queuedFloats    = 1<<2 | 1<<5 // var_prefill_length, var_decode_kv_tokens
)

// requestValues holds the values of one request map, by field index.
type requestValues struct {
	ints   [7]int64
	floats [7]float64
}

func (r *requestValues) scheduled() ScheduledRequests {
	return ScheduledRequests{
		NumPrefillRequests: r.ints[0], SumPrefillTokens: r.ints[1], VarPrefillLength: r.floats[2],
		SumPrefillKVTokens: r.ints[3], NumDecodeRequests: r.ints[4], SumDecodeKVTokens: r.ints[5],
		VarDecodeKVTokens: r.floats[6],
	}
}

func (r *requestValues) queued() QueuedRequests {
	return QueuedRequests{
		NumPrefillRequests: r.ints[0], SumPrefillTokens: r.ints[1], VarPrefillLength: r.floats[2],
		NumDecodeRequests: r.ints[3], SumDecodeKVTokens: r.ints[4], VarDecodeKVTokens: r.floats[5],
	}
}

// ---- msgpack ----

// appendFPMMsgpackFast is the fast path of DecodeFPM. When payload has the common shape (see the file
// comment: a fixmap of the 7 fields, request maps as fixmaps of their 7 and 6 fields, keys as fixstr)
// and passes the FPM rules, it fills every typed field of f but WorkerID and JSON, appends the canonical
// JSON to dst, and returns the worker_id bytes (aliasing payload) with ok. Otherwise ok is false and
// the returned buffer is dst.
func appendFPMMsgpackFast(dst, src []byte, f *FPM) (out, workerID []byte, ok bool) {
	if len(src) == 0 || len(src) > maxNodes || src[0] != 0x80|byte(len(topFields)) {
		return dst, nil, false
	}
	start := len(dst)
	dst = append(dst, '{')
	p := 1
	var seen uint
	var sched, queued requestValues
	for i := range len(topFields) {
		id, next := topNames.mpField(src, p, i)
		if next == 0 || seen&(1<<id) != 0 {
			return dst[:start], nil, false
		}
		seen |= 1 << id
		dst = topNames.appendJSONKey(dst, id, i)
		p = next
		switch id {
		case topVersion:
			var u uint64
			if u, next = mpUint(src, p); next == 0 || u != FPMVersion {
				return dst[:start], nil, false
			}
			dst = append(dst, '1')
		case topWorkerID:
			var lo int
			if lo, next = mpStrAt(src, p); next == 0 || !utf8.Valid(src[lo:next]) {
				return dst[:start], nil, false
			}
			workerID = src[lo:next]
			dst = appendEscaped(dst, workerID)
		case topDPRank, topCounterID:
			var u uint64
			if u, next = mpUint(src, p); next == 0 || u > math.MaxInt64 {
				return dst[:start], nil, false
			}
			dst = strconv.AppendUint(dst, u, 10)
			if id == topDPRank {
				f.DPRank = int64(u)
			} else {
				f.CounterID = int64(u)
			}
		case topWallTime:
			if dst, f.WallTime, next = appendMpNumber(dst, src, p); next == 0 {
				return dst[:start], nil, false
			}
		case topScheduled:
			if dst, next = appendMpRequests(dst, src, p, scheduledNames, scheduledFloats, &sched); next == 0 {
				return dst[:start], nil, false
			}
		case topQueued:
			if dst, next = appendMpRequests(dst, src, p, queuedNames, queuedFloats, &queued); next == 0 {
				return dst[:start], nil, false
			}
		}
		p = next
	}
	if p != len(src) {
		return dst[:start], nil, false
	}
	f.Version = FPMVersion
	f.Scheduled = sched.scheduled()
	f.Queued = queued.queued()
	return append(dst, '}'), workerID, true
}

// appendMpRequests reads the request map at p: a fixmap holding exactly n's names, floats being the
// mask of the number fields. It stores the values in r, appends the map's JSON to dst and returns the
// offset after it, or 0.
func appendMpRequests(dst, src []byte, p int, n *fastNames, floats uint, r *requestValues) ([]byte, int) {
	if p >= len(src) || src[p] != 0x80|byte(len(n.names)) {
		return dst, 0
	}
	p++
	dst = append(dst, '{')
	var seen uint
	for i := range n.names {
		id, next := n.mpField(src, p, i)
		if next == 0 || seen&(1<<id) != 0 {
			return dst, 0
		}
		seen |= 1 << id
		dst = n.appendJSONKey(dst, id, i)
		if floats&(1<<id) != 0 {
			if dst, r.floats[id], next = appendMpNumber(dst, src, next); next == 0 {
				return dst, 0
			}
		} else {
			var u uint64
			if u, next = mpUint(src, next); next == 0 || u > math.MaxInt64 {
				return dst, 0
			}
			dst = strconv.AppendUint(dst, u, 10)
			r.ints[id] = int64(u)
		}
		p = next
	}
	return append(dst, '}'), p
}

// mpStrAt reads the str value (fixstr, str8, str16 or str32) at p and returns the offsets of its bytes,
// lo:next, or next 0.
func mpStrAt(src []byte, p int) (lo, next int) {
	if p >= len(src) {
		return 0, 0
	}
	var n uint64
	switch m := src[p]; {
	case m&0xe0 == 0xa0:
		n, lo = uint64(m&0x1f), p+1
	case m == 0xd9 && len(src)-p >= 2:
		n, lo = uint64(src[p+1]), p+2
	case m == 0xda && len(src)-p >= 3:
		n, lo = uint64(binary.BigEndian.Uint16(src[p+1:])), p+3
	case m == 0xdb && len(src)-p >= 5:
		n, lo = uint64(binary.BigEndian.Uint32(src[p+1:])), p+5
	default:
		return 0, 0
	}
	if uint64(len(src)-lo) < n {
		return 0, 0
	}
	return lo, lo + int(n)
}

// mpUint reads the integer at p when it is >= 0 (positive fixint, uint8..64, or int8..64 holding a
// non-negative value) and returns it and the offset after it, or next 0 (any other value, or
// truncated).
func mpUint(src []byte, p int) (u uint64, next int) {
	if p >= len(src) {
		return 0, 0
	}
	m := src[p]
	if m <= 0x7f {
		return uint64(m), p + 1
	}
	if m < 0xcc || m > 0xd3 {
		return 0, 0
	}
	size := 1 << ((m - 0xcc) & 3) // uint8..64 (0xcc..0xcf), int8..64 (0xd0..0xd3)
	if len(src)-p-1 < size {
		return 0, 0
	}
	b := src[p+1 : p+1+size]
	switch size {
	case 1:
		u = uint64(b[0])
	case 2:
		u = uint64(binary.BigEndian.Uint16(b))
	case 4:
		u = uint64(binary.BigEndian.Uint32(b))
	default:
		u = binary.BigEndian.Uint64(b)
	}
	if m >= 0xd0 && b[0]&0x80 != 0 { // a negative signed integer
		return 0, 0
	}
	return u, p + 1 + size
}

// appendMpNumber reads the number at p when it is finite and >= 0 (-0.0 included): a float64, a
// float32 (widened), or a non-negative integer. It appends its canonical JSON to dst and returns its
// value and the offset after it, or next 0.
func appendMpNumber(dst, src []byte, p int) ([]byte, float64, int) {
	if p >= len(src) {
		return dst, 0, 0
	}
	var x float64
	next := 0
	switch src[p] {
	case 0xcb:
		if len(src)-p < 9 {
			return dst, 0, 0
		}
		x, next = math.Float64frombits(binary.BigEndian.Uint64(src[p+1:])), p+9
	case 0xca:
		if len(src)-p < 5 {
			return dst, 0, 0
		}
		x, next = float64(math.Float32frombits(binary.BigEndian.Uint32(src[p+1:]))), p+5
	default:
		u, q := mpUint(src, p)
		if q == 0 {
			return dst, 0, 0
		}
		return strconv.AppendUint(dst, u, 10), float64(u), q
	}
	if !(x >= 0 && x <= math.MaxFloat64) { // NaN, ±Inf, negative (-0.0 passes, as checkNumber lets it)
		return dst, 0, 0
	}
	return appendJSONFloat(dst, x), x, next
}

// ---- JSON ----

// parseFPMJSONFast is the fast path of ParseFPMJSON. When body is an FPM object in the compact form
// (no whitespace but after the object; the 7 fields, the request objects their 7 and 6 fields, any
// order; keys without escapes; worker_id without escapes or control characters; counts as plain
// non-negative integer literals; numbers non-negative) that passes the FPM rules, it fills every typed
// field of f but WorkerID and JSON and returns the worker_id bytes (aliasing body) with ok.
func parseFPMJSONFast(body []byte, f *FPM) (workerID []byte, ok bool) {
	if len(body) == 0 || len(body) > maxNodes || body[0] != '{' {
		return nil, false
	}
	p := 1
	var seen uint
	var sched, queued requestValues
	for i := range len(topFields) {
		if i > 0 {
			if p >= len(body) || body[p] != ',' {
				return nil, false
			}
			p++
		}
		id, next := jsonFieldIndex(body, p, topFields[:], i)
		if next == 0 || seen&(1<<id) != 0 {
			return nil, false
		}
		seen |= 1 << id
		p = next
		switch id {
		case topVersion:
			var u uint64
			if u, next = jsonUint(body, p); next == 0 || u != FPMVersion {
				return nil, false
			}
		case topWorkerID:
			var lo int
			if lo, next = jsonFastString(body, p); next == 0 {
				return nil, false
			}
			workerID = body[lo : next-1]
		case topDPRank, topCounterID:
			var u uint64
			if u, next = jsonUint(body, p); next == 0 {
				return nil, false
			}
			if id == topDPRank {
				f.DPRank = int64(u)
			} else {
				f.CounterID = int64(u)
			}
		case topWallTime:
			if f.WallTime, next = jsonNumber(body, p); next == 0 {
				return nil, false
			}
		case topScheduled:
			if next = jsonRequests(body, p, scheduledFields[:], scheduledFloats, &sched); next == 0 {
				return nil, false
			}
		case topQueued:
			if next = jsonRequests(body, p, queuedFields[:], queuedFloats, &queued); next == 0 {
				return nil, false
			}
		}
		p = next
	}
	if p >= len(body) || body[p] != '}' || skipWS(body, p+1) != len(body) {
		return nil, false
	}
	f.Version = FPMVersion
	f.Scheduled = sched.scheduled()
	f.Queued = queued.queued()
	return workerID, true
}

// jsonRequests reads the request object at p, holding exactly names (floats: the mask of the number
// fields), stores the values in r and returns the offset after it, or 0.
func jsonRequests(body []byte, p int, names []string, floats uint, r *requestValues) int {
	if p >= len(body) || body[p] != '{' {
		return 0
	}
	p++
	var seen uint
	for i := range names {
		if i > 0 {
			if p >= len(body) || body[p] != ',' {
				return 0
			}
			p++
		}
		id, next := jsonFieldIndex(body, p, names, i)
		if next == 0 || seen&(1<<id) != 0 {
			return 0
		}
		seen |= 1 << id
		if floats&(1<<id) != 0 {
			if r.floats[id], next = jsonNumber(body, next); next == 0 {
				return 0
			}
		} else {
			var u uint64
			if u, next = jsonUint(body, next); next == 0 {
				return 0
			}
			r.ints[id] = int64(u)
		}
		p = next
	}
	if p >= len(body) || body[p] != '}' {
		return 0
	}
	return p + 1
}

// jsonFieldIndex reads `"key":` at p, where key must be one of names, and returns the key's index and
// the offset after the colon, or next 0. Names hold no quote or backslash, so body holds key name
// exactly when it holds the name followed by `":` (the name at hint is tried first).
func jsonFieldIndex(body []byte, p int, names []string, hint int) (id, next int) {
	if p >= len(body) || body[p] != '"' {
		return -1, 0
	}
	p++
	rest := body[p:]
	if hint < len(names) && isJSONKey(rest, names[hint]) {
		return hint, p + len(names[hint]) + 2
	}
	for j, name := range names {
		if isJSONKey(rest, name) {
			return j, p + len(name) + 2
		}
	}
	return -1, 0
}

// isJSONKey reports whether b starts with name followed by `":`.
func isJSONKey(b []byte, name string) bool {
	return len(b) >= len(name)+2 && b[len(name)] == '"' && b[len(name)+1] == ':' && string(b[:len(name)]) == name
}

// jsonFastString reads the string at p when it has no escapes and no control characters and is valid
// UTF-8, and returns the offset of its first byte and the offset after its closing quote, or next 0.
func jsonFastString(body []byte, p int) (lo, next int) {
	if p >= len(body) || body[p] != '"' {
		return 0, 0
	}
	lo = p + 1
	ascii := true
	for q := lo; q < len(body); q++ {
		switch c := body[q]; {
		case c == '"':
			if !ascii && !utf8.Valid(body[lo:q]) {
				return 0, 0
			}
			return lo, q + 1
		case c == '\\' || c < 0x20:
			return 0, 0
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0
}

// isStructural reports whether c may follow a value of the compact FPM object.
func isStructural(c byte) bool { return c == ',' || c == '}' }

// jsonUint reads the integer literal at p when it is "0" or [1-9][0-9]* with a value <= MaxInt64 and is
// followed by ',' or '}', and returns it and the offset after it, or next 0.
func jsonUint(body []byte, p int) (u uint64, next int) {
	q := p
	for ; q < len(body) && q-p < 19; q++ { // 19 digits cannot overflow a uint64
		c := body[q] - '0'
		if c > 9 {
			break
		}
		u = u*10 + uint64(c)
	}
	n := q - p
	if n == 0 || (body[p] == '0' && n > 1) || u > math.MaxInt64 || q >= len(body) || !isStructural(body[q]) {
		return 0, 0
	}
	return u, q
}

// pow10 holds the powers of ten that a float64 represents exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14,
	1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// jsonNumber reads the number at p when it is a non-negative JSON number (no '-') followed by ',' or
// '}', whose value, as the general path reads it, passes the rules for a number field: an integer
// literal <= MaxInt64, or a float literal strconv.ParseFloat reads without error. It returns the value
// and the offset after it, or next 0.
func jsonNumber(body []byte, p int) (x float64, next int) {
	q := p
	var m uint64 // the digits, while there are at most 19 of them
	digits := 0
	for ; q < len(body) && body[q]-'0' <= 9; q++ {
		m = m*10 + uint64(body[q]-'0')
		digits++
	}
	if q == p || (body[p] == '0' && q-p > 1) || digits > 19 || q >= len(body) {
		return 0, 0
	}
	if isStructural(body[q]) { // an integer literal: kindInt in the general path
		if m > math.MaxInt64 {
			return 0, 0
		}
		return float64(m), q
	}
	frac := 0
	if body[q] == '.' {
		q++
		for ; q < len(body) && body[q]-'0' <= 9; q++ {
			m = m*10 + uint64(body[q]-'0')
			digits++
			frac++
		}
		if frac == 0 {
			return 0, 0
		}
	}
	exp := q < len(body) && (body[q] == 'e' || body[q] == 'E')
	if exp {
		var ok bool
		if q, ok = skipExponent(body, q); !ok {
			return 0, 0
		}
	}
	if q >= len(body) || !isStructural(body[q]) {
		return 0, 0
	}
	if !exp && digits <= 19 && m < 1<<53 && frac < len(pow10) {
		// Exact mantissa and power of ten: one correctly rounded division, as strconv's own exact
		// path computes it, so the bits equal strconv.ParseFloat's.
		return float64(m) / pow10[frac], q
	}
	x, err := strconv.ParseFloat(string(body[p:q]), 64)
	if err != nil {
		return 0, 0
	}
	return x, q
}
