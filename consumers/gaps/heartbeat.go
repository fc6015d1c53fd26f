package gaps

import (
	"bytes"
	"strconv"

	"github.com/fpmbus/fpmbus/schemas"
)

// wallTimeField is the wall_time key without its opening quote: 'w' starts few JSON keys and values,
// '"' every one of them, so the search stops at fewer false starts.
var wallTimeField = []byte(`wall_time":`)

// isHeartbeat reports whether the canonical FPM JSON body is an idle heartbeat (schemas.FPM.IsHeartbeat).
// A busy forward pass has a non-zero wall_time, which is read without parsing the whole body; only a
// zero wall_time costs a full parse.
func isHeartbeat(body []byte) bool {
	if v := wallTimeValue(body); v != nil {
		if nonZeroDecimal(v) {
			return false
		}
		if f, err := strconv.ParseFloat(string(v), 64); err == nil && f != 0 {
			return false
		}
	}
	f, err := schemas.ParseFPMJSON(body)
	return err == nil && f.IsHeartbeat()
}

// wallTimeValue is the raw value after the first "wall_time": in body, up to the next ',' or '}',
// without surrounding blanks (nil: no such key).
func wallTimeValue(body []byte) []byte {
	for off := 0; ; {
		i := bytes.Index(body[off:], wallTimeField)
		if i < 0 {
			return nil
		}
		i += off
		if i == 0 || body[i-1] != '"' {
			off = i + 1
			continue
		}
		rest := body[i+len(wallTimeField):]
		j := 0
		for j < len(rest) && rest[j] != ',' && rest[j] != '}' {
			j++
		}
		return bytes.TrimSpace(rest[:j])
	}
}

// nonZeroDecimal reports whether v is a plain decimal number (-?digits, optionally .digits; no
// exponent) of at most 20 bytes with a non-zero digit: strconv.ParseFloat reads it as a non-zero
// number (too short to underflow), without the string it would need.
func nonZeroDecimal(v []byte) bool {
	if len(v) > 20 {
		return false
	}
	if len(v) > 0 && v[0] == '-' {
		v = v[1:]
	}
	nonZero, digits, dot := false, 0, false
	for i, c := range v {
		switch {
		case c >= '0' && c <= '9':
			digits++
			nonZero = nonZero || c != '0'
		case c == '.' && !dot && digits > 0 && i < len(v)-1:
			dot = true
		default:
			return false
		}
	}
	return nonZero
}
