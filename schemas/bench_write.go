package schemas

import (
	"bufio"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

// Output format of benchmark documents. fpmbus writes merged artefacts and worker-probe sidecars the way
// Dynamo's merger writes them with Python's json.dump(doc, f, indent=2): two-space indentation, ", "-free
// item separators at line ends, ": " between key and value, "[]" and "{}" for empty containers, no
// trailing newline, and every character outside printable ASCII escaped (ensure_ascii: "\u00e9", a
// surrogate pair above U+FFFF). Members keep the tree's order; numbers are written as their literal text
// (so values copied from rank files are byte-identical to the source) and computed floats use Python's
// repr (NewBenchFloat).

// WriteBenchJSON writes n to w in the indented format above. It buffers internally and does not close w.
func WriteBenchJSON(w io.Writer, n *BenchNode) error {
	bw := bufio.NewWriterSize(w, 256<<10)
	jw := benchWriter{w: bw}
	jw.value(n, 0)
	if jw.err != nil {
		return jw.err
	}
	jw.flush()
	if jw.err != nil {
		return jw.err
	}
	return bw.Flush()
}

// AppendBenchJSON appends n in the indented format above.
func AppendBenchJSON(dst []byte, n *BenchNode) []byte {
	jw := benchWriter{buf: dst}
	jw.value(n, 0)
	return jw.buf
}

// AppendBenchCompact appends n as compact JSON (no whitespace at all), keys in tree order, with the same
// string escaping.
func AppendBenchCompact(dst []byte, n *BenchNode) []byte {
	jw := benchWriter{buf: dst, compact: true}
	jw.value(n, 0)
	return jw.buf
}

type benchWriter struct {
	w       *bufio.Writer // nil: accumulate in buf only
	buf     []byte
	err     error
	compact bool
}

func (jw *benchWriter) flush() {
	if jw.w == nil || jw.err != nil {
		return
	}
	_, jw.err = jw.w.Write(jw.buf)
	jw.buf = jw.buf[:0]
}

func (jw *benchWriter) newline(depth int) {
	if jw.compact {
		return
	}
	jw.buf = append(jw.buf, '\n')
	for range depth {
		jw.buf = append(jw.buf, ' ', ' ')
	}
}

func (jw *benchWriter) value(n *BenchNode, depth int) {
	if jw.err != nil {
		return
	}
	if jw.w != nil && len(jw.buf) > 64<<10 {
		jw.flush()
	}
	if n == nil {
		jw.buf = append(jw.buf, "null"...)
		return
	}
	switch n.Kind {
	case BenchNull:
		jw.buf = append(jw.buf, "null"...)
	case BenchBool, BenchNumber:
		jw.buf = append(jw.buf, n.Str...)
	case BenchString:
		jw.buf = appendPythonJSONString(jw.buf, n.Str)
	case BenchArray, BenchObject:
		if n.Raw() {
			if full, err := ParseBenchJSON([]byte(n.Str)); err == nil {
				jw.value(full, depth)
			} else {
				jw.buf = append(jw.buf, n.Str...)
			}
			return
		}
		open, closing := byte('['), byte(']')
		if n.Kind == BenchObject {
			open, closing = '{', '}'
		}
		jw.buf = append(jw.buf, open)
		if len(n.Kids) == 0 {
			jw.buf = append(jw.buf, closing)
			return
		}
		for i := range n.Kids {
			if i > 0 {
				jw.buf = append(jw.buf, ',')
			}
			jw.newline(depth + 1)
			if n.Kind == BenchObject {
				jw.buf = appendPythonJSONString(jw.buf, n.Keys[i])
				jw.buf = append(jw.buf, ':')
				if !jw.compact {
					jw.buf = append(jw.buf, ' ')
				}
			}
			jw.value(&n.Kids[i], depth+1)
		}
		jw.newline(depth)
		jw.buf = append(jw.buf, closing)
	}
}

// namedEscapes are the bytes Python's json module escapes by name: '"', '\\', \n, \r, \t, \b and \f.
var namedEscapes = [256]byte{'"': '"', '\\': '\\', '\n': 'n', '\r': 'r', '\t': 't', '\b': 'b', '\f': 'f'}

// appendPythonJSONString appends s as a JSON string the way Python's json module writes it with
// ensure_ascii: '"' and '\\' escaped, \n \r \t \b \f by name, every other byte outside 0x20..0x7e as
// \uXXXX (UTF-16 surrogate pairs above U+FFFF, lowercase hex).
func appendPythonJSONString(dst []byte, s string) []byte {
	const hexd = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c < 0x7f && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		if e := namedEscapes[c]; e != 0 {
			dst = append(dst, '\\', e)
		} else {
			r, size := rune(c), 1
			if c >= utf8.RuneSelf {
				r, size = utf8.DecodeRuneInString(s[i:])
			}
			u := func(v rune) {
				dst = append(dst, '\\', 'u', hexd[v>>12&0xf], hexd[v>>8&0xf], hexd[v>>4&0xf], hexd[v&0xf])
			}
			if r > 0xffff {
				r -= 0x10000
				u(0xd800 + (r>>10)&0x3ff)
				u(0xdc00 + r&0x3ff)
			} else {
				u(r)
			}
			i += size - 1
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendPythonFloat appends f as Python's repr(float) writes it: the shortest digits that round-trip,
// positional notation with at least one fractional digit ("10.0", "0.0001") when the decimal exponent is
// in [-4, 16), otherwise "d[.ddd]e±XX" with at least two exponent digits ("1e-05", "1.5e+16"). NaN and
// infinities are written as Python writes them (NaN, Infinity, -Infinity), which is not JSON; callers
// only format finite values.
func AppendPythonFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "NaN"...)
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	}
	var tmp [32]byte
	e := strconv.AppendFloat(tmp[:0], f, 'e', -1, 64) // -d.ddde±XX
	neg := e[0] == '-'
	if neg {
		e = e[1:]
	}
	mant, exps := e, []byte(nil)
	for i, c := range e {
		if c == 'e' {
			mant, exps = e[:i], e[i+1:]
			break
		}
	}
	exp, _ := strconv.Atoi(string(exps))
	digits := make([]byte, 0, len(mant))
	for _, c := range mant {
		if c != '.' {
			digits = append(digits, c)
		}
	}
	if neg {
		dst = append(dst, '-')
	}
	if exp >= -4 && exp < 16 {
		if exp < 0 {
			dst = append(dst, '0', '.')
			for range -exp - 1 {
				dst = append(dst, '0')
			}
			return append(dst, digits...)
		}
		intPart := exp + 1
		if len(digits) <= intPart {
			dst = append(dst, digits...)
			for range intPart - len(digits) {
				dst = append(dst, '0')
			}
			return append(dst, '.', '0')
		}
		dst = append(dst, digits[:intPart]...)
		dst = append(dst, '.')
		return append(dst, digits[intPart:]...)
	}
	dst = append(dst, digits[0])
	if len(digits) > 1 {
		dst = append(dst, '.')
		dst = append(dst, digits[1:]...)
	}
	dst = append(dst, 'e')
	if exp < 0 {
		dst = append(dst, '-')
		exp = -exp
	} else {
		dst = append(dst, '+')
	}
	if exp < 10 {
		dst = append(dst, '0')
	}
	return strconv.AppendInt(dst, int64(exp), 10)
}
