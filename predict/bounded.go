package predict

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Error texts are bounded. A refusal's detail and a query's decoding error may quote the input (a
// phase, a key, a number the JSON decoder could not store), and the input may be megabytes long: cut
// to MaxDetail bytes, an answer's size follows from its query's, and an error fits a header.

// MaxDetail is the longest text, in bytes, a refusal's detail or a decoding error carries.
const MaxDetail = 512

// Bounded returns s with control characters (line breaks included, which would end a header) replaced
// by spaces and cut to at most MaxDetail bytes at a character boundary, saying how many were cut.
func Bounded(s string) string {
	clean := func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}
	if len(s) <= MaxDetail {
		return strings.Map(clean, s)
	}
	// The suffix names the bytes cut, at most len(s): room for that many digits is kept.
	keep := MaxDetail - len("… ( bytes cut)") - len(strconv.Itoa(len(s)))
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return strings.Map(clean, s[:keep]) + "… (" + strconv.Itoa(len(s)-keep) + " bytes cut)"
}

// boundedErr returns err with a Bounded text; errors.Is and errors.As still see err.
func boundedErr(err error) error {
	if err == nil {
		return nil
	}
	return &boundedError{err}
}

type boundedError struct{ err error }

func (e *boundedError) Error() string { return Bounded(e.err.Error()) }
func (e *boundedError) Unwrap() error { return e.err }
