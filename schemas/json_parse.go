package schemas

import (
	"errors"
	"math"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is a small, strict, order-preserving JSON reader producing the same node tree as the msgpack
// reader, so FPM bodies read back from NATS and trace lines are validated by the same code. It follows
// RFC 8259 as serde_json does: no comments, no trailing commas, no leading zeros, no NaN, strings must be
// valid UTF-8 and may not hold raw control characters or unpaired surrogate escapes. Like the msgpack
// reader it rejects duplicate keys and nests at most maxDepth containers. Integer literals stay integers
// (kindInt, kindUint, or kindBigInt beyond 64 bits); a number with a fraction or exponent is a float.

// parseJSON decodes d.src into d.nodes. The top-level value must be an object, followed only by
// whitespace.
func (d *decoder) parseJSON() error {
	src := d.src
	if len(src) > maxNodes {
		return d.jfail(0, "document larger than 4 GiB")
	}
	p := skipWS(src, 0)
	if p == len(src) {
		return d.jfail(p, "empty document, want an object")
	}
	if src[p] != '{' {
		if k, ok := jsonKind(src[p]); ok {
			return d.jfail(p, "top-level value is "+k.article()+" "+k.String()+", want an object")
		}
		return d.jfail(p, "invalid character "+strconv.QuoteRune(rune(src[p]))+" at top level")
	}
	p, err := d.jvalue(p, 0)
	if err != nil {
		return err
	}
	if p = skipWS(src, p); p != len(src) {
		return d.jfail(p, "trailing data after the top-level object")
	}
	return nil
}

func (d *decoder) jfail(off int, msg string) error {
	return &decodeError{Format: formatJSON, Offset: off, Field: d.pathString(), Err: errors.New(msg)}
}

func skipWS(src []byte, p int) int {
	for p < len(src) {
		switch src[p] {
		case ' ', '\t', '\n', '\r':
			p++
		default:
			return p
		}
	}
	return p
}

// jsonKind returns the kind a JSON value starting with c has.
func jsonKind(c byte) (kind, bool) {
	switch c {
	case '{':
		return kindMap, true
	case '[':
		return kindArray, true
	case '"':
		return kindStr, true
	case 't', 'f':
		return kindBool, true
	case 'n':
		return kindNil, true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return kindFloat64, true
	}
	return 0, false
}

// jvalue decodes the value at p (not whitespace) and returns the offset after it.
func (d *decoder) jvalue(p, level int) (int, error) {
	src := d.src
	if p >= len(src) {
		return p, d.jfail(p, "unexpected end of JSON")
	}
	idx := len(d.nodes)
	d.nodes = append(d.nodes, node{off: uint32(p), end: uint32(idx + 1)})
	switch c := src[p]; c {
	case '{':
		return d.jobject(idx, p, level)
	case '[':
		return d.jarray(idx, p, level)
	case '"':
		return d.jstring(idx, p)
	case 't':
		return d.jliteral(idx, p, "true", kindBool, 1)
	case 'f':
		return d.jliteral(idx, p, "false", kindBool, 0)
	case 'n':
		return d.jliteral(idx, p, "null", kindNil, 0)
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return d.jnumber(idx, p)
		}
		return p, d.jfail(p, "invalid character "+strconv.QuoteRune(rune(c))+" looking for a value")
	}
}

func (d *decoder) jliteral(idx, p int, lit string, k kind, bits uint64) (int, error) {
	if len(d.src)-p < len(lit) || string(d.src[p:p+len(lit)]) != lit {
		return p, d.jfail(p, "invalid literal, want "+lit)
	}
	d.nodes[idx].kind = k
	d.nodes[idx].bits = bits
	return p + len(lit), nil
}

func (d *decoder) jobject(idx, start, level int) (int, error) {
	if level+1 > maxDepth {
		return start, d.jfail(start, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	src := d.src
	p := skipWS(src, start+1)
	count := uint32(0)
	if p < len(src) && src[p] == '}' {
		p++
	} else {
		for end := false; !end; {
			if p >= len(src) {
				return p, d.jfail(p, "unexpected end of JSON in object")
			}
			if src[p] != '"' {
				return p, d.jfail(p, "object key must be a string")
			}
			key := len(d.nodes)
			d.nodes = append(d.nodes, node{off: uint32(p), end: uint32(key + 1)})
			var err error
			if p, err = d.jstring(key, p); err != nil {
				return p, err
			}
			if p = skipWS(src, p); p >= len(src) || src[p] != ':' {
				return p, d.jfail(p, "expected ':' after object key")
			}
			d.path[d.depth] = keySeg(key)
			d.depth++
			p, err = d.jvalue(skipWS(src, p+1), level+1)
			if err != nil {
				return p, err
			}
			d.depth--
			count++
			if p, end, err = d.jnext(p, '}', "object"); err != nil {
				return p, err
			}
		}
	}
	n := &d.nodes[idx]
	n.kind = kindMap
	n.count = count
	n.end = uint32(len(d.nodes))
	d.setRaw(idx, start, p)
	if dup := d.checkDuplicateKeys(idx); dup >= 0 {
		return p, d.duplicateKey(dup, d.jfail)
	}
	return p, nil
}

// jnext reads what follows a member or element of the container (in: "object" or "array") that
// closing ends: the closing byte (end, p after it) or a ',' (p at what follows, white space skipped).
func (d *decoder) jnext(p int, closing byte, in string) (next int, end bool, err error) {
	src := d.src
	if p = skipWS(src, p); p >= len(src) {
		return p, false, d.jfail(p, "unexpected end of JSON in "+in)
	}
	switch src[p] {
	case closing:
		return p + 1, true, nil
	case ',':
		return skipWS(src, p+1), false, nil
	}
	return p, false, d.jfail(p, "expected ',' or '"+string(closing)+"' in "+in)
}

func (d *decoder) jarray(idx, start, level int) (int, error) {
	if level+1 > maxDepth {
		return start, d.jfail(start, "nesting deeper than "+strconv.Itoa(maxDepth)+" levels")
	}
	src := d.src
	p := skipWS(src, start+1)
	count := 0
	if p < len(src) && src[p] == ']' {
		p++
	} else {
		seg := d.depth
		d.depth++
		for end := false; !end; {
			d.path[seg] = indexSeg(count)
			var err error
			if p, err = d.jvalue(p, level+1); err != nil {
				return p, err
			}
			count++
			if p, end, err = d.jnext(p, ']', "array"); err != nil {
				return p, err
			}
		}
		d.depth--
	}
	n := &d.nodes[idx]
	n.kind = kindArray
	n.count = uint32(count)
	n.end = uint32(len(d.nodes))
	d.setRaw(idx, start, p)
	return p, nil
}

// jstring decodes the string whose opening quote is at start. Without escapes the node points into the
// source; otherwise the unescaped text is appended to d.aux.
func (d *decoder) jstring(idx, start int) (int, error) {
	src := d.src
	p := start + 1
	for p < len(src) {
		c := src[p]
		switch {
		case c == '"':
			d.nodes[idx].kind = kindStr
			d.setRaw(idx, start+1, p)
			return p + 1, nil
		case c == '\\':
			return d.jstringEscaped(idx, start, p)
		case c < 0x20:
			return p, d.jfail(p, "control character in string")
		case c < utf8.RuneSelf:
			p++
		default:
			r, size := utf8.DecodeRune(src[p:])
			if r == utf8.RuneError && size <= 1 {
				return p, d.jfail(p, "invalid UTF-8 in string")
			}
			p += size
		}
	}
	return p, d.jfail(p, "unexpected end of JSON in string")
}

// jstringEscaped continues jstring from the first backslash at p.
func (d *decoder) jstringEscaped(idx, start, p int) (int, error) {
	src := d.src
	a := len(d.aux)
	d.aux = append(d.aux, src[start+1:p]...)
	for p < len(src) {
		c := src[p]
		switch {
		case c == '"':
			d.nodes[idx].kind = kindStr
			d.setRaw(idx, a, len(d.aux))
			d.nodes[idx].inAux = true
			return p + 1, nil
		case c == '\\':
			if p+1 >= len(src) {
				return p, d.jfail(p, "unexpected end of JSON in string escape")
			}
			switch e := src[p+1]; e {
			case '"', '\\', '/':
				d.aux = append(d.aux, e)
			case 'b':
				d.aux = append(d.aux, '\b')
			case 'f':
				d.aux = append(d.aux, '\f')
			case 'n':
				d.aux = append(d.aux, '\n')
			case 'r':
				d.aux = append(d.aux, '\r')
			case 't':
				d.aux = append(d.aux, '\t')
			case 'u':
				r, ok := jsonHex4(src, p+2)
				if !ok {
					return p, d.jfail(p, "invalid \\u escape")
				}
				n := 6
				if utf16.IsSurrogate(r) {
					r2, ok2 := rune(0), false
					if r < 0xdc00 && len(src)-p >= 12 && src[p+6] == '\\' && src[p+7] == 'u' {
						r2, ok2 = jsonHex4(src, p+8)
					}
					if !ok2 || r2 < 0xdc00 || r2 > 0xdfff {
						return p, d.jfail(p, "unpaired surrogate in \\u escape")
					}
					r = utf16.DecodeRune(r, r2)
					n = 12
				}
				d.aux = utf8.AppendRune(d.aux, r)
				p += n
				continue
			default:
				return p, d.jfail(p, "invalid escape "+strconv.QuoteRune(rune(e)))
			}
			p += 2
		case c < 0x20:
			return p, d.jfail(p, "control character in string")
		case c < utf8.RuneSelf:
			d.aux = append(d.aux, c)
			p++
		default:
			r, size := utf8.DecodeRune(src[p:])
			if r == utf8.RuneError && size <= 1 {
				return p, d.jfail(p, "invalid UTF-8 in string")
			}
			d.aux = append(d.aux, src[p:p+size]...)
			p += size
		}
	}
	return p, d.jfail(p, "unexpected end of JSON in string")
}

// jsonNumberFaults are the FPM reader's messages for a number that breaks the grammar.
var jsonNumberFaults = [...]string{
	numberNoInteger:  "invalid number",
	numberNoFraction: "invalid number: digit expected after '.'",
	numberNoExponent: "invalid number: digit expected in exponent",
}

// jnumber decodes the number at start.
func (d *decoder) jnumber(idx, start int) (int, error) {
	src := d.src
	p, intEnd, isFloat, fault := scanJSONNumber(src, start)
	if fault != numberOK {
		return p, d.jfail(start, jsonNumberFaults[fault])
	}
	neg := src[start] == '-'
	digitsAt := start
	if neg {
		digitsAt++
	}
	text := src[start:p]
	n := &d.nodes[idx]
	if !isFloat {
		// Accumulate the magnitude; fall back to a big integer when it exceeds uint64.
		var u uint64
		overflow := false
		for _, c := range src[digitsAt:intEnd] {
			v := uint64(c - '0')
			if u > (math.MaxUint64-v)/10 {
				overflow = true
				break
			}
			u = u*10 + v
		}
		switch {
		case neg && !overflow && u == 0: // serde_json reads -0 as the float -0.0
			n.kind, n.bits = kindFloat64, math.Float64bits(math.Copysign(0, -1))
		case !overflow && !neg && u <= math.MaxInt64:
			n.kind, n.bits = kindInt, u
		case !overflow && !neg:
			n.kind, n.bits = kindUint, u
		case !overflow && u <= 1<<63:
			n.kind, n.bits = kindInt, uint64(-int64(u)) // -1<<63 wraps to itself
		default:
			f, err := strconv.ParseFloat(string(text), 64)
			if err != nil && (math.IsInf(f, 0) || math.IsNaN(f)) {
				return p, d.jfail(start, "number out of range")
			}
			n.kind = kindBigInt
			d.setRaw(idx, start, p)
		}
		return p, nil
	}
	f, err := strconv.ParseFloat(string(text), 64)
	if err != nil {
		return p, d.jfail(start, "number out of range")
	}
	n.kind, n.bits = kindFloat64, math.Float64bits(f)
	return p, nil
}
