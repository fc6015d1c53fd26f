package schemas

// The lexical rules of JSON (RFC 8259) that both JSON readers of this package apply the same way: the
// FPM reader (json_parse.go, over []byte) and the benchmark artefact reader (bench_json.go, over a
// string). Each reader keeps its own error messages and positions; the grammar is here once.

// numberFault is where a JSON number breaks the grammar.
type numberFault uint8

const (
	numberOK         numberFault = iota
	numberNoInteger              // no integer part after the optional '-'
	numberNoFraction             // no digit after '.'
	numberNoExponent             // no digit in the exponent
)

// scanJSONNumber scans the JSON number at s[start]: an optional '-', an integer part without leading
// zeros, then an optional fraction and exponent. It returns the offset after it (end), the offset
// after its integer part (intEnd) and whether it has a fraction or an exponent (isFloat). A number
// that breaks the grammar has a fault, and end is the offset where the grammar broke.
func scanJSONNumber[S ~string | ~[]byte](s S, start int) (end, intEnd int, isFloat bool, fault numberFault) {
	i := start
	if s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		i = skipDigits(s, i)
	default:
		return i, i, false, numberNoInteger
	}
	intEnd = i
	if i < len(s) && s[i] == '.' {
		isFloat = true
		d := i + 1
		if i = skipDigits(s, d); i == d {
			return i, intEnd, isFloat, numberNoFraction
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		isFloat = true
		var ok bool
		if i, ok = skipExponent(s, i); !ok {
			return i, intEnd, isFloat, numberNoExponent
		}
	}
	return i, intEnd, isFloat, numberOK
}

// skipExponent skips the exponent at s[i], which is 'e' or 'E': an optional sign and digits. It
// returns the offset after it; ok is false when it has no digit (end is then where one was due).
func skipExponent[S ~string | ~[]byte](s S, i int) (end int, ok bool) {
	i++
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	end = skipDigits(s, i)
	return end, end > i
}

// skipDigits returns the offset of the first byte at or after i that is not an ASCII digit.
func skipDigits[S ~string | ~[]byte](s S, i int) int {
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}

// jsonHex4 parses the four hex digits of a \u escape at s[i:].
func jsonHex4[S ~string | ~[]byte](s S, i int) (rune, bool) {
	if len(s)-i < 4 {
		return 0, false
	}
	var r rune
	for k := i; k < i+4; k++ {
		c := s[k]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
