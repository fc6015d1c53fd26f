package replay

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

// The ZMQ payload of a recorded FPM. A trace holds the canonical JSON of what the worker sent (every
// field, unknown ones too, in payload order); the replay sends the msgpack map that decodes back to
// exactly that JSON: integers stay integers (smallest encoding, as msgspec writes them), other numbers
// are float64 (a float32 the worker sent was widened exactly when it was recorded, and renders the
// same), strings are str, null is nil, arrays and objects keep their order. Every payload is checked
// when it is built: schemas.DecodeFPM of it must render the recorded bytes, byte for byte.
//
// Two rewrites happen on the way, both on the top-level object only: worker_id through the worker map,
// and, when counter ids are renumbered, counter_id, whose value is left as a slot (payload.counterAt)
// that the pacer fills with the sequence number at send time.

// Errors of encodePayload.
var (
	// errUnencodable: the fpm holds a value msgpack cannot carry (an integer beyond 64 bits).
	errUnencodable = errors.New("replay: fpm value has no msgpack encoding")
	// errNotCanonical: the recorded fpm JSON is not canonical (not as Dynamo's or fpmbus's trace writer
	// writes it, today or with the ryu float format of serde_json before 1.0.150), so no payload decodes
	// back to its exact bytes.
	errNotCanonical = errors.New("replay: fpm JSON is not canonical")
)

// payload is one record's msgpack payload. With counterAt >= 0, bytes[counterAt:counterEnd] is the
// recorded counter_id's encoding, replaced at send time when counter ids are renumbered.
type payload struct {
	bytes                 []byte
	counterAt, counterEnd int
}

// build appends the payload to dst with counter_id set to counter (renumbering), or as recorded when
// renumber is false.
func (p *payload) build(dst []byte, renumber bool, counter uint64) []byte {
	if !renumber || p.counterAt < 0 {
		return append(dst, p.bytes...)
	}
	dst = append(dst, p.bytes[:p.counterAt]...)
	dst = schemas.AppendMsgpackUint(dst, counter)
	return append(dst, p.bytes[p.counterEnd:]...)
}

// encodePayload returns the msgpack payload of fpm (a canonical FPM JSON object), appended to dst
// (which it may reuse), and checks it: schemas.DecodeFPM of it must render fpm byte for byte. With
// newWorker non-empty, worker_id is then replaced by it (the payload must still decode, to that
// worker_id). dec is the caller's decoder (one per goroutine).
func encodePayload(dst, fpm []byte, newWorker string, dec *schemas.Decoder) (payload, error) {
	p, err := transcode(dst, fpm, nil)
	if err != nil {
		return payload{}, err
	}
	var f schemas.FPM
	if err := dec.DecodeFPM(p.bytes, &f); err != nil {
		return payload{}, fmt.Errorf("%w: the re-encoded payload does not decode: %v", errNotCanonical, err)
	}
	if !bytes.Equal(f.JSON, fpm) && !sameButExponentSigns(f.JSON, fpm) {
		at := 0
		for at < len(f.JSON) && at < len(fpm) && f.JSON[at] == fpm[at] {
			at++
		}
		return payload{}, fmt.Errorf("%w: re-encoded, it renders differently from byte %d", errNotCanonical, at)
	}
	if newWorker == "" {
		return p, nil
	}
	if p, err = transcode(p.bytes[:0], fpm, map[string]string{f.WorkerID: newWorker}); err != nil {
		return payload{}, err
	}
	if err := dec.DecodeFPM(p.bytes, &f); err != nil || f.WorkerID != newWorker {
		return payload{}, fmt.Errorf("%w: the payload with worker_id %q does not decode to it: %v", errNotCanonical, newWorker, err)
	}
	return p, nil
}

// sameButExponentSigns reports whether rendered, the canonical JSON of today's writer, differs from
// recorded only where recorded writes a positive exponent without its '+' ("1e16" for "1e+16"): a
// trace written by Dynamo before its serde_json formatted floats with zmij (1.0.150). Such a recording
// replays; its payload carries the same float bits, which today's writer renders with the sign. A '+'
// after an 'e' where the two differ is always in a number: string bytes render as recorded.
func sameButExponentSigns(rendered, recorded []byte) bool {
	i, j := 0, 0
	for i < len(rendered) && j < len(recorded) {
		if rendered[i] == recorded[j] {
			i, j = i+1, j+1
			continue
		}
		if rendered[i] != '+' || i == 0 || rendered[i-1] != 'e' || recorded[j] < '0' || recorded[j] > '9' {
			return false
		}
		i++
	}
	return i == len(rendered) && j == len(recorded)
}

// transcode turns the JSON object fpm into msgpack appended to dst[:0], worker_id mapped through
// workers (nil: unchanged).
func transcode(dst, fpm []byte, workers map[string]string) (payload, error) {
	e := transcoder{src: fpm, out: dst[:0], workers: workers, counterAt: -1}
	p, err := e.value(skipSpace(fpm, 0), 0)
	if err == nil && skipSpace(fpm, p) != len(fpm) {
		err = e.fail(p, "trailing data")
	}
	if err != nil {
		return payload{}, err
	}
	return payload{bytes: e.out, counterAt: e.counterAt, counterEnd: e.counterEnd}, nil
}

// maxPayloadDepth bounds nesting, as the schemas decoder does (the top-level map is depth 1).
const maxPayloadDepth = 32

// transcoder turns one JSON value into msgpack.
type transcoder struct {
	src                   []byte
	out                   []byte
	workers               map[string]string
	counterAt, counterEnd int
}

func (e *transcoder) fail(p int, msg string) error {
	return fmt.Errorf("%w: byte %d: %s", errNotCanonical, p, msg)
}

// value transcodes the value at p (depth: containers above it) and returns the offset after it.
func (e *transcoder) value(p, depth int) (int, error) {
	if p >= len(e.src) {
		return p, e.fail(p, "value expected")
	}
	switch c := e.src[p]; {
	case c == '{':
		return e.object(p, depth+1)
	case c == '[':
		return e.array(p, depth+1)
	case c == '"':
		s, next, err := e.str(p)
		if err != nil {
			return next, err
		}
		e.out = schemas.AppendMsgpackStr(e.out, s)
		return next, nil
	case c == 't':
		return e.literal(p, "true", 0xc3)
	case c == 'f':
		return e.literal(p, "false", 0xc2)
	case c == 'n':
		return e.literal(p, "null", 0xc0)
	case c == '-' || c >= '0' && c <= '9':
		return e.number(p)
	}
	return p, e.fail(p, "unexpected character "+strconv.QuoteRune(rune(e.src[p])))
}

func (e *transcoder) literal(p int, lit string, code byte) (int, error) {
	if !bytes.HasPrefix(e.src[p:], []byte(lit)) {
		return p, e.fail(p, "invalid literal")
	}
	e.out = append(e.out, code)
	return p + len(lit), nil
}

// container is how msgpack heads a JSON object (a map) or array, and the byte that closes it in JSON.
type container struct {
	fix, c16, c32 byte // header codes: fixmap/fixarray, map16/array16, map32/array32
	closer        byte
}

var (
	mapCodes   = container{fix: 0x80, c16: 0xde, c32: 0xdf, closer: '}'}
	arrayCodes = container{fix: 0x90, c16: 0xdc, c32: 0xdd, closer: ']'}
)

// open starts the container c at p: its depth checked, its header reserved at its widest (the entry
// count is only known at the end) at head. An empty container is finished at once (done).
func (e *transcoder) open(p, depth int, c container) (head, next int, done bool, err error) {
	if depth > maxPayloadDepth {
		return 0, p, false, e.fail(p, "nested deeper than "+strconv.Itoa(maxPayloadDepth))
	}
	head = len(e.out)
	e.out = append(e.out, c.c32, 0, 0, 0, 0)
	p = skipSpace(e.src, p+1)
	if p < len(e.src) && e.src[p] == c.closer {
		e.finishHeader(head, 0, c.fix, c.c16, c.c32)
		return head, p + 1, true, nil
	}
	return head, p, false, nil
}

// next moves past the separator after an entry of c: to the next entry, or past c's end (closed).
func (e *transcoder) next(p int, c container) (int, bool, error) {
	p = skipSpace(e.src, p)
	switch {
	case p < len(e.src) && e.src[p] == ',':
		return skipSpace(e.src, p+1), false, nil
	case p < len(e.src) && e.src[p] == c.closer:
		return p + 1, true, nil
	}
	return p, false, e.fail(p, "',' or '"+string(c.closer)+"' expected")
}

// object transcodes the object at p, its map header shrunk once its pairs are counted.
func (e *transcoder) object(p, depth int) (int, error) {
	head, p, done, err := e.open(p, depth, mapCodes)
	if done || err != nil {
		return p, err
	}
	for n := 1; ; n++ {
		if p >= len(e.src) || e.src[p] != '"' {
			return p, e.fail(p, "object key expected")
		}
		key, next, err := e.str(p)
		if err != nil {
			return next, err
		}
		e.out = schemas.AppendMsgpackStr(e.out, key)
		p = skipSpace(e.src, next)
		if p >= len(e.src) || e.src[p] != ':' {
			return p, e.fail(p, "':' expected")
		}
		p = skipSpace(e.src, p+1)
		top := depth == 1
		switch {
		case top && key == "worker_id" && p < len(e.src) && e.src[p] == '"' && e.workers != nil:
			s, next, err := e.str(p)
			if err != nil {
				return next, err
			}
			if nw, ok := e.workers[s]; ok {
				s = nw
			}
			e.out = schemas.AppendMsgpackStr(e.out, s)
			p = next
		case top && key == "counter_id":
			at := len(e.out)
			if p, err = e.value(p, depth); err != nil {
				return p, err
			}
			e.counterAt, e.counterEnd = at, len(e.out)
		default:
			if p, err = e.value(p, depth); err != nil {
				return p, err
			}
		}
		var closed bool
		if p, closed, err = e.next(p, mapCodes); err != nil {
			return p, err
		}
		if !closed {
			continue
		}
		shift := e.finishHeader(head, n, mapCodes.fix, mapCodes.c16, mapCodes.c32)
		if e.counterAt > head && depth == 1 {
			e.counterAt, e.counterEnd = e.counterAt-shift, e.counterEnd-shift
		}
		return p, nil
	}
}

// array transcodes the array at p, its header shrunk once its elements are counted.
func (e *transcoder) array(p, depth int) (int, error) {
	head, p, done, err := e.open(p, depth, arrayCodes)
	if done || err != nil {
		return p, err
	}
	for n := 1; ; n++ {
		if p, err = e.value(p, depth); err != nil {
			return p, err
		}
		var closed bool
		if p, closed, err = e.next(p, arrayCodes); err != nil {
			return p, err
		}
		if closed {
			e.finishHeader(head, n, arrayCodes.fix, arrayCodes.c16, arrayCodes.c32)
			return p, nil
		}
	}
}

// finishHeader rewrites the 5-byte container header reserved at head for n entries in the smallest
// form (fix, 16-bit or 32-bit code), moving what follows, and returns how many bytes it removed.
func (e *transcoder) finishHeader(head, n int, fix, c16, c32 byte) int {
	var h []byte
	switch {
	case n < 16:
		h = []byte{fix | byte(n)}
	case n <= math.MaxUint16:
		h = binary.BigEndian.AppendUint16([]byte{c16}, uint16(n))
	default:
		h = binary.BigEndian.AppendUint32([]byte{c32}, uint32(n))
	}
	shift := 5 - len(h)
	copy(e.out[head:], h)
	if shift > 0 {
		copy(e.out[head+len(h):], e.out[head+5:])
		e.out = e.out[:len(e.out)-shift]
	}
	return shift
}

// str reads the JSON string at p and returns its text.
func (e *transcoder) str(p int) (string, int, error) {
	end := p + 1
	escaped := false
	for ; end < len(e.src); end++ {
		c := e.src[end]
		if c == '\\' {
			escaped = true
			end++
			continue
		}
		if c == '"' {
			break
		}
	}
	if end >= len(e.src) {
		return "", end, e.fail(p, "unterminated string")
	}
	raw := e.src[p : end+1]
	if !escaped {
		return string(raw[1 : len(raw)-1]), end + 1, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", end + 1, e.fail(p, "invalid string: "+err.Error())
	}
	return s, end + 1, nil
}

// number transcodes the JSON number at p as the schemas reader types it: an integer literal is an
// integer (int64 or uint64; beyond that errUnencodable), "-0" and anything with a fraction or an
// exponent is a float64.
func (e *transcoder) number(p int) (int, error) {
	start := p
	if e.src[p] == '-' {
		p++
	}
	isFloat := false
	for ; p < len(e.src); p++ {
		c := e.src[p]
		if c >= '0' && c <= '9' {
			continue
		}
		if c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			isFloat = true
			continue
		}
		break
	}
	text := string(e.src[start:p])
	if !isFloat {
		if text == "-0" {
			e.out = schemas.AppendMsgpackFloat(e.out, math.Copysign(0, -1))
			return p, nil
		}
		if v, err := strconv.ParseInt(text, 10, 64); err == nil {
			e.out = schemas.AppendMsgpackInt(e.out, v)
			return p, nil
		}
		if u, err := strconv.ParseUint(text, 10, 64); err == nil {
			e.out = schemas.AppendMsgpackUint(e.out, u)
			return p, nil
		}
		if _, err := strconv.ParseFloat(text, 64); err == nil {
			return p, fmt.Errorf("%w: integer %s at byte %d is beyond 64 bits", errUnencodable, text, start)
		}
		return p, e.fail(start, "invalid number "+strconv.Quote(text))
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return p, e.fail(start, "invalid number "+strconv.Quote(text))
	}
	e.out = schemas.AppendMsgpackFloat(e.out, f)
	return p, nil
}

func skipSpace(src []byte, p int) int {
	for p < len(src) && (src[p] == ' ' || src[p] == '\t' || src[p] == '\n' || src[p] == '\r') {
		p++
	}
	return p
}
