package schemas

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The canonical JSON of an FPM is the compact JSON object that Dynamo's Rust trace writer nests under
// "fpm" (rmp_serde into serde_json::Value, then serde_json::to_writer). fpmbus publishes it as the NATS
// message body and the trace writer copies it verbatim, so it must be byte-identical to Dynamo's:
//
//   - keys in payload order; every field kept, unknown ones too, at any depth;
//   - no whitespace;
//   - strings escaped as serde_json does: `"` and `\` backslash-escaped, \b \f \n \r \t, other control
//     characters as \u00xx (lowercase hex); nothing else is escaped: not <, >, &, DEL, U+2028 or U+2029
//     (Go's encoding/json escapes the last two, serde_json does not);
//   - integers as integers (a msgpack int stays an int even where a float is expected: wall_time 0);
//   - floats as serde_json 1.0.150 formats an f64 (appendJSONFloat); a msgpack float32 is first widened
//     exactly to float64, because serde_json::Value stores every float as f64 (0.1f32 is written
//     0.10000000149011612, as Dynamo writes it); non-finite floats (only possible in unknown fields) are
//     written as null, as serde_json::Value does;
//   - msgpack nil as null, bool as true/false, arrays and maps as JSON arrays and objects;
//   - msgpack bin as a JSON array of byte values (0..255), the shape serde_json gives a Vec<u8>;
//   - msgpack ext as a two-element array [type, [bytes...]], the shape of rmp_serde's ext tuple.
//
// Dynamo itself drops payloads carrying bin or ext values (serde_json::Value has no bytes type); fpmbus
// carries them in the shapes above so that no payload field is ever lost.

// appendJSONFloat appends f formatted exactly as Rust's serde_json 1.0.150 writes an f64, the version
// today's Dynamo pins (its Cargo.lock): since serde-rs/json PR #1304, serde_json formats floats with zmij.
// zmij picks the same digits as ryu, which serde_json used before (the shortest that round-trip), and
// the same layout, except that a non-negative exponent carries a '+' (zmij's own ryu comparison test
// states exactly this difference). With kk the position of the decimal point (scientific exponent + 1):
// plain decimal when 0 < kk <= 16 (".0" appended to integers: 100.0, 1000000000000000.0), "0.000ddd"
// when -5 < kk <= 0, otherwise scientific with a signed exponent and no leading zeros ("1e+16",
// "1.5e-7", "1.7976931348623157e+308", "5e-324"). Zero is "0.0" or "-0.0". NaN and infinities are
// written as null, as serde_json does.
func appendJSONFloat(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if f == 0 {
		if math.Signbit(f) {
			return append(dst, "-0.0"...)
		}
		return append(dst, "0.0"...)
	}
	var buf [32]byte
	b := strconv.AppendFloat(buf[:0], f, 'e', -1, 64) // [-]d[.ddd]e±XX[X]
	if b[0] == '-' {
		dst = append(dst, '-')
		b = b[1:]
	}
	var digits [20]byte
	n := 0
	i := 0
	for ; b[i] != 'e'; i++ {
		if b[i] != '.' {
			digits[n] = b[i]
			n++
		}
	}
	i++ // 'e'
	expNeg := b[i] == '-'
	i++ // sign
	exp := 0
	for ; i < len(b); i++ {
		exp = exp*10 + int(b[i]-'0')
	}
	if expNeg {
		exp = -exp
	}
	kk := exp + 1
	d := digits[:n]
	switch {
	case 0 < kk && kk <= 16:
		if n <= kk { // integral: 1234e7 -> 12340000000.0
			dst = append(dst, d...)
			for j := n; j < kk; j++ {
				dst = append(dst, '0')
			}
			return append(dst, '.', '0')
		}
		dst = append(dst, d[:kk]...) // 1234e-2 -> 12.34
		dst = append(dst, '.')
		return append(dst, d[kk:]...)
	case -5 < kk && kk <= 0: // 1234e-6 -> 0.001234
		dst = append(dst, '0', '.')
		for j := kk; j < 0; j++ {
			dst = append(dst, '0')
		}
		return append(dst, d...)
	}
	dst = append(dst, d[0])
	if n > 1 { // 1234e30 -> 1.234e33
		dst = append(dst, '.')
		dst = append(dst, d[1:]...)
	}
	dst = append(dst, 'e')
	if kk-1 >= 0 {
		dst = append(dst, '+') // zmij signs a positive exponent; ryu did not
	}
	return strconv.AppendInt(dst, int64(kk-1), 10)
}

// appendJSONString appends s as a JSON string escaped as serde_json escapes it (see the file comment).
// Invalid UTF-8 cannot occur in a Rust string; here each run of invalid bytes is replaced by U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return appendEscaped(dst, s)
}

const hexDigits = "0123456789abcdef"

// escapeByte[b] is 0 for bytes copied as they are, the escape letter for \b \t \n \f \r \" \\, and 'u'
// for the other control characters.
var escapeByte = [256]byte{
	0x00: 'u', 0x01: 'u', 0x02: 'u', 0x03: 'u', 0x04: 'u', 0x05: 'u', 0x06: 'u', 0x07: 'u',
	0x08: 'b', 0x09: 't', 0x0a: 'n', 0x0b: 'u', 0x0c: 'f', 0x0d: 'r', 0x0e: 'u', 0x0f: 'u',
	0x10: 'u', 0x11: 'u', 0x12: 'u', 0x13: 'u', 0x14: 'u', 0x15: 'u', 0x16: 'u', 0x17: 'u',
	0x18: 'u', 0x19: 'u', 0x1a: 'u', 0x1b: 'u', 0x1c: 'u', 0x1d: 'u', 0x1e: 'u', 0x1f: 'u',
	'"': '"', '\\': '\\',
}

// appendEscaped appends the valid UTF-8 text s as a quoted JSON string.
func appendEscaped[S string | []byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		e := escapeByte[s[i]]
		if e == 0 {
			continue
		}
		dst = append(dst, s[start:i]...)
		if e == 'u' {
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[s[i]>>4], hexDigits[s[i]&0xf])
		} else {
			dst = append(dst, '\\', e)
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendCanonical appends the canonical JSON of the value at t.nodes[i] and returns the index of the
// node after it. Keys and strings in the tree are valid UTF-8 (the parsers check).
func appendCanonical(dst []byte, t *tree, i int) ([]byte, int) {
	n := &t.nodes[i]
	switch n.kind {
	case kindNil:
		return append(dst, "null"...), i + 1
	case kindBool:
		if n.bits != 0 {
			return append(dst, "true"...), i + 1
		}
		return append(dst, "false"...), i + 1
	case kindInt:
		return strconv.AppendInt(dst, n.int64(), 10), i + 1
	case kindUint:
		return strconv.AppendUint(dst, n.uint64(), 10), i + 1
	case kindBigInt:
		return append(dst, t.raw(n)...), i + 1
	case kindFloat32:
		return appendJSONFloat(dst, float64(n.float32())), i + 1
	case kindFloat64:
		return appendJSONFloat(dst, n.float64()), i + 1
	case kindStr:
		return appendEscaped(dst, t.raw(n)), i + 1
	case kindBin:
		return appendByteArray(dst, t.raw(n)), i + 1
	case kindExt:
		dst = append(dst, '[')
		dst = strconv.AppendInt(dst, int64(n.ext), 10)
		dst = append(dst, ',')
		dst = appendByteArray(dst, t.raw(n))
		return append(dst, ']'), i + 1
	case kindArray:
		dst = append(dst, '[')
		j := i + 1
		for k := uint32(0); k < n.count; k++ {
			if k > 0 {
				dst = append(dst, ',')
			}
			dst, j = appendCanonical(dst, t, j)
		}
		return append(dst, ']'), j
	}
	// kindMap
	dst = append(dst, '{')
	j := i + 1
	for k := uint32(0); k < n.count; k++ {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = appendEscaped(dst, t.raw(&t.nodes[j]))
		dst = append(dst, ':')
		dst, j = appendCanonical(dst, t, j+1)
	}
	return append(dst, '}'), j
}

// appendByteArray appends b as a JSON array of byte values.
func appendByteArray(dst, b []byte) []byte {
	dst = append(dst, '[')
	for k, c := range b {
		if k > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(c), 10)
	}
	return append(dst, ']')
}
